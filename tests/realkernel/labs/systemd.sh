# Lab "systemd" (lab 3): the Debian package under a real systemd.  The distribution's
# default kernel (as lab host) with mtty, a bookworm userland with systemd as PID 1 (built by
# mmdebstrap; bookworm because the package's venv is built for the host's Python 3.11), and
# the package `make deb` builds, installed in the guest with apt.  The rootfs overlay writes
# to a disk image, so the guest reboots once with the service enabled and the next boot
# finds the package, the config and the ledger.  Beside mtty, QEMU's 82576 SR-IOV NIC
# (`-device igb` behind an emulated Intel IOMMU, as lab igb) driven by bookworm's igb/igbvf:
# the unit, unchanged, runs a VF pool too (its CAP_NET_ADMIN helper, the hand-over to
# vfio-pci).  igb is new in QEMU 8.0: the outer QEMU is lab trixie's (its cached rootfs),
# not the host's 7.2.  tests/realkernel/systemd/.
# Sourced by lab.sh; the variables are described in tests/realkernel/README.md (Profiles).
# shellcheck shell=bash disable=SC2034 # the variables are lab.sh's
LAB_KERNEL=default
LAB_ABI_ENV=ACCEL_REALKERNEL_ABI
LAB_ROOT=rootfs
LAB_SUITE=bookworm
# The package's own dependencies are added by lab.sh (LAB_DEB: its Depends and Recommends).
# iproute2: the tests read a VF's MAC and VLAN with `ip link show`, not through the agent.
LAB_ROOTFS_PACKAGES=(systemd systemd-sysv dbus python3 python3-pytest procps kmod util-linux passwd
	iproute2)
LAB_INIT=systemd
LAB_DEB=1
LAB_DISK_MB=1024
LAB_GUEST_REBOOTS=1
LAB_GUEST_SCRIPT=tests/realkernel/systemd/guest.sh
LAB_MEMORY_MB=1024
# Both boots: 186-517 s at load 1-4; at load 6-7 (six jobs sharing 2 cores) the first boot
# alone took 790 s (apt install 287 s, the first start 204 s).
LAB_TIMEOUT=1200
# mtty and its chain; the disk: virtio_blk and ext4 (crc32c for ext4's checksums); the
# NIC's PF and VF drivers and vfio-pci (loaded here: the unit's ProtectKernelModules=yes
# leaves module loading to the host, as an operator's modules-load.d would).
LAB_MODULES=(vfio_iommu_type1 mtty virtio_blk ext4 crc32c_generic igb igbvf vfio_pci)
LAB_OUTER_QEMU=trixie
LAB_QEMU_ARGS=(
	-machine q35 -device intel-iommu,intremap=on
	-netdev hubport,id=n0,hubid=0 -device igb,netdev=n0,mac=52:54:00:12:34:56
)
LAB_APPEND="intel_iommu=on iommu=pt"
LAB_TESTS=(tests/realkernel/systemd)
