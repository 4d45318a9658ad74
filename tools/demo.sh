#!/usr/bin/env bash
# `make demo`: the agent's main job on a simulated GPU host (no hardware needed).
# Mounts a FUSE-simulated host, writes a config for it, validates it, lists the types and
# reports the per-GPU inventory, then unmounts.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR="${1:-/run/accel-agent-demo}"
SYSFS="$DEMO_DIR/sysfs"
CONF="$DEMO_DIR/accel-agent.conf"
CTL=(.venv/bin/accelctl)

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

rm -rf "$DEMO_DIR/state"
mkdir -p "$SYSFS" "$DEMO_DIR/state"
"${CTL[@]}" simulate umount "$SYSFS" >/dev/null 2>&1 || true
trap '"${CTL[@]}" simulate umount "$SYSFS" >/dev/null 2>&1 || true' EXIT

step "Mount a simulated GPU host at $SYSFS"
run "${CTL[@]}" simulate mount "$SYSFS" \
	--profile nvidia-pf --profile nvidia-sriov --profile nvidia-vfio --gpus 1 --vfs 4 \
	--profile i915-gvtg --profile mtty

cat >"$CONF" <<CONF
[DEFAULT]
host = demo-host
sysfs_root = $SYSFS
state_dir = $DEMO_DIR/state

rescan_interval = 1

[api]
socket_path = $DEMO_DIR/api.sock

[libvirt]
# no libvirt on a simulated host
uri =

[devices]
# nvidia-35 is the default type of every GPU not listed below.
enabled_mdev_types = nvidia-35, nvidia-475, nvidia-1150, i915-GVTg_V5_4, mtty-2

[mdev_nvidia-35]

[mdev_nvidia-475]
# A100-20C on the SR-IOV VFs: at most 2 per card, whatever the 4 VFs read.
device_addresses = 41:00.4, 41:00.5, 41:00.6, 41:00.7
mdev_class = CUSTOM_A100_20C

[mdev_nvidia-1150]
# L40S-4Q on an NVIDIA vGPU 17+ GPU: no mdev; a vGPU is one of the PF's VFs,
# typed through nvidia/current_vgpu_type. Configured by the PF's address.
device_addresses = 0000:c1:00.0

[mdev_i915-GVTg_V5_4]
device_addresses = 0000:00:02.0

[mdev_mtty-2]
device_addresses = mtty
CONF
step "Config ($CONF)"
sed -n '/^\[devices\]/,$p' "$CONF"

step "Validate the config against the host"
run "${CTL[@]}" --config-file "$CONF" check-config

step "mdev types offered by each parent"
run "${CTL[@]}" --config-file "$CONF" types

step "Inventory per physical GPU (what Placement receives)"
run "${CTL[@]}" --config-file "$CONF" inventory

step "Start the agent daemon (API on $DEMO_DIR/api.sock, rescan every second)"
.venv/bin/accel-agent --config-file "$CONF" >"$DEMO_DIR/agent.log" 2>&1 &
AGENT_PID=$!
trap 'kill "$AGENT_PID" 2>/dev/null || true; wait "$AGENT_PID" 2>/dev/null || true; "${CTL[@]}" simulate umount "$SYSFS" >/dev/null 2>&1 || true' EXIT
# The API answers while the agent starts ("starting": recovery, layouts);
# it takes changes once it is ready, so wait for that, not for the socket.
status=""
for _ in $(seq 240); do
    status=$("${CTL[@]}" --config-file "$CONF" health --json 2>/dev/null \
        | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin).get("status", ""))' 2>/dev/null) || true
    [ -n "$status" ] && [ "$status" != starting ] && break
    kill -0 "$AGENT_PID" 2>/dev/null || break
    sleep 0.5
done
[ -n "$status" ] && [ "$status" != starting ] || { echo "the daemon did not start:" >&2; cat "$DEMO_DIR/agent.log" >&2; exit 1; }
echo "accel-agent running as pid $AGENT_PID"

step "Allocate 3 vGPUs to an instance (through the daemon's API)"
run "${CTL[@]}" --config-file "$CONF" allocate demo-vm-1 --count 3
run "${CTL[@]}" --config-file "$CONF" domain-xml demo-vm-1

step "A vGPU on the NVIDIA vGPU 17+ GPU: the agent types one of its VFs"
run "${CTL[@]}" --config-file "$CONF" allocate demo-vm-2 --count 1 --type nvidia-1150
run "${CTL[@]}" --config-file "$CONF" nova-pci-config

step "Attach all of an instance's accelerators in one call: an mdev and a vGPU VF, all or nothing"
run "${CTL[@]}" --config-file "$CONF" attach demo-vm-3 --vgpu mtty-2 --vgpu nvidia-1150
echo "(a request with a bad field is refused whole, naming the field; nothing is made:)"
"${CTL[@]}" --config-file "$CONF" attach demo-vm-4 --vgpu mtty-2 --vf nic_a,vlan=5000 ||
	echo "(exit $?)"
run "${CTL[@]}" --config-file "$CONF" detach demo-vm-3 --remove

step "Simulated host reboot: every mdev is gone, every VF untyped; the daemon re-creates them by itself"
run "${CTL[@]}" simulate reboot "$SYSFS"
count_mdevs() {
	"${CTL[@]}" --config-file "$CONF" mdevs --json |
		.venv/bin/python -c 'import json,sys; print(len(json.load(sys.stdin)["mdevs"]))'
}
for _ in $(seq 60); do [ "$(count_mdevs)" = 4 ] && break; sleep 0.5; done
run "${CTL[@]}" --config-file "$CONF" mdevs
run "${CTL[@]}" --config-file "$CONF" inventory

step "Release and remove, then stop the daemon (SIGTERM)"
run "${CTL[@]}" --config-file "$CONF" release demo-vm-1 --remove
run "${CTL[@]}" --config-file "$CONF" release demo-vm-2 --remove
kill -TERM "$AGENT_PID"
wait "$AGENT_PID" || true
echo "daemon log (last lines):"
tail -n 8 "$DEMO_DIR/agent.log" | cut -c1-160

step "A broken config is refused, naming the address and both types"
cat >"$DEMO_DIR/broken.conf" <<CONF
[DEFAULT]
sysfs_root = $SYSFS
[devices]
enabled_mdev_types = nvidia-35, nvidia-36
[mdev_nvidia-35]
device_addresses = 0000:84:00.0
[mdev_nvidia-36]
device_addresses = 84:00.0
CONF
if run "${CTL[@]}" --config-file "$DEMO_DIR/broken.conf" check-config; then
	echo "unexpected: the broken config passed" >&2
	exit 1
fi
echo "(exit 1, as expected)"
step "Done: the simulated host is unmounted on exit"
