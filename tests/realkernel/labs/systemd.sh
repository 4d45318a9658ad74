# Lab "systemd" (lab 3): the Debian package under a real systemd.  The distribution's
# default kernel (as lab host) with mtty, a bookworm userland with systemd as PID 1 (built by
# mmdebstrap; bookworm because the package's venv is built for the host's Python 3.11), and
# the package `make deb` builds, installed in the guest with apt.  The rootfs overlay writes
# to a disk image, so the guest reboots once with the service enabled and the next boot
# finds the package, the config and the ledger.  tests/realkernel/systemd/.
# Sourced by lab.sh; the variables are described in tests/realkernel/README.md (Profiles).
# shellcheck shell=bash disable=SC2034 # the variables are lab.sh's
LAB_KERNEL=default
LAB_ABI_ENV=ACCEL_REALKERNEL_ABI
LAB_ROOT=rootfs
LAB_SUITE=bookworm
# The package's own dependencies are added by lab.sh (LAB_DEB: its Depends and Recommends).
LAB_ROOTFS_PACKAGES=(systemd systemd-sysv dbus python3 python3-pytest procps kmod util-linux passwd)
LAB_INIT=systemd
LAB_DEB=1
LAB_DISK_MB=1024
LAB_GUEST_REBOOTS=1
LAB_GUEST_SCRIPT=tests/realkernel/systemd/guest.sh
LAB_MEMORY_MB=1024
LAB_TIMEOUT=900
# mtty and its chain; the disk: virtio_blk and ext4 (crc32c for ext4's checksums).
LAB_MODULES=(vfio_iommu_type1 mtty virtio_blk ext4 crc32c_generic)
LAB_QEMU_ARGS=()
LAB_APPEND=""
LAB_TESTS=(tests/realkernel/systemd)
