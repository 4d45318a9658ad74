# Lab "trixie" (lab 2): Debian's 6.12 kernel from bookworm-security (mtty there can migrate
# its device state) and a trixie userland with QEMU 10 and libvirt 11, built by mmdebstrap
# from the Debian archive into the lab cache; the agent is installed in a venv inside it.
# Two libvirtds and two agents live-migrate a VM with an mdev between them.
# docs/design.md §7.4, §12.  Sourced by lab.sh; see tests/realkernel/README.md (Profiles).
# shellcheck shell=bash disable=SC2034 # the variables are lab.sh's
LAB_KERNEL=6.12
LAB_ABI_ENV=ACCEL_REALKERNEL_TRIXIE_ABI
LAB_ROOT=rootfs
LAB_SUITE=trixie
LAB_ROOTFS_PACKAGES=(
	qemu-system-x86 libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients
	python3 python3-venv python3-libvirt iproute2 procps kmod mount util-linux
	# libvirt's node-device driver (virsh nodedev-define/-start/-autostart, as Nova 34
	# does); it depends on mdevctl (the definitions, /etc/mdevctl.d) and udev (udevd runs
	# mdevctl's rule that starts a parent's defined mdevs): tests/realkernel/libvirtdefs/
	libvirt-daemon-driver-nodedev mdevctl udev
)
# Python distributions the rootfs takes from Debian, not from the wheelhouse:
# libvirt-python is an sdist on PyPI (a C build against libvirt); python3-libvirt is built
# for the rootfs's own libvirt.
LAB_DEBIAN_PYTHON=(libvirt-python)
LAB_VENV=/opt/accel-lab/venv
# Two libvirtds, two agents and, during a migration, two QEMUs of the inner VM.
LAB_MEMORY_MB=2048
LAB_TIMEOUT=900
LAB_MODULES=(vfio_iommu_type1 mtty)
LAB_QEMU_ARGS=()
LAB_APPEND=""
# libvirtdefs first: it reloads mtty and stops what it starts before the migration
# session starts its two hosts.
LAB_TESTS=(tests/realkernel/libvirtdefs tests/realkernel/migration)
