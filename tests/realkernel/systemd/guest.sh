#!/bin/bash
# Lab "systemd": run by lab-guest.service (tests/realkernel/init.sh) at every boot of the
# guest, in the checkout (read-only).  Boot 1 installs the package and drives the unit
# (test_boot1.py), then enables it and exits 200: lab-guest reboots the guest.  Boot 2
# checks what the enabled unit did at boot (test_boot2.py), merges both junit files into
# realkernel.junit.xml for run.sh and exits with the worse status (lab-guest powers off).
# The guest's root is an overlay whose upper layer is the lab disk: /var/lib/accel-lab
# survives the reboot.  Extra arguments go to both pytest runs.
set -u
OUT=${LAB_OUT:?}
STATE=/var/lib/accel-lab
mkdir -p "$STATE" "$OUT/logs"
boot=$(($(cat "$STATE/boot" 2>/dev/null || echo 0) + 1))
echo "$boot" >"$STATE/boot"

# The tests start from a booted system (default.target reached; "degraded" is fine).
timeout 300 systemctl is-system-running --wait >/dev/null

tests() {
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest --noconftest -p no:cacheprovider \
		-q -rfEs --color=no "$@"
}

case "$boot" in
1)
	rm -f "$OUT"/junit-boot*.xml
	rc=0
	tests tests/realkernel/systemd/test_boot1.py --junitxml="$OUT/junit-boot1.xml" "$@" || rc=$?
	echo "$rc" >"$STATE/rc-boot1"
	journalctl -b --no-pager >"$OUT/logs/journal-boot1.log" 2>&1
	sync
	exit 200
	;;
2)
	rc=0
	tests tests/realkernel/systemd/test_boot2.py --junitxml="$OUT/junit-boot2.xml" "$@" || rc=$?
	journalctl -b --no-pager -u accel-agent >"$OUT/logs/accel-agent-boot2.log" 2>&1
	python3 - "$OUT/realkernel.junit.xml" "$OUT"/junit-boot1.xml "$OUT"/junit-boot2.xml <<'PY'
import sys
import xml.etree.ElementTree as ET

merged = ET.Element("testsuites")
for name in sys.argv[2:]:
    try:
        root = ET.parse(name).getroot()
    except (OSError, ET.ParseError):
        continue
    merged.extend([root] if root.tag == "testsuite" else root.findall("testsuite"))
ET.ElementTree(merged).write(sys.argv[1], encoding="utf-8", xml_declaration=True)
PY
	rc1=$(cat "$STATE/rc-boot1" 2>/dev/null || echo 1)
	[ "$rc1" = 0 ] || rc=$rc1
	exit "$rc"
	;;
*)
	echo "lab systemd: unexpected boot $boot" >&2
	exit 70
	;;
esac
