# Lab "igb" (lab 3): an SR-IOV NIC driven by its real driver.  The trixie lab (Debian's 6.12
# kernel, the trixie rootfs with the agent in a venv: the same cached tree, since the
# package list is the same) with QEMU's 82576 (`-device igb`, 7 VFs) behind an emulated
# Intel IOMMU, so that a VF can be handed to vfio-pci.  igb is new in QEMU 8.0: the outer
# QEMU is the rootfs's (10.0), not the host's 7.2.  The NIC's only network is a QEMU hub
# port: no frame leaves QEMU.  docs/design.md §10.4, §12.
# Sourced by lab.sh; see tests/realkernel/README.md (Profiles).
# shellcheck shell=bash disable=SC2034 # the variables are lab.sh's
# shellcheck source=trixie.sh
. "$HERE/labs/trixie.sh"
LAB_OUTER_QEMU=rootfs
# mtty stays: init.sh checks its parent, and an attach of an mdev and a VF together needs it.
LAB_MODULES=(vfio_iommu_type1 mtty igb igbvf vfio_pci)
LAB_QEMU_ARGS=(
	-machine q35 -device intel-iommu,intremap=on
	-netdev hubport,id=n0,hubid=0 -device igb,netdev=n0,mac=52:54:00:12:34:56
)
LAB_APPEND="intel_iommu=on iommu=pt"
LAB_MEMORY_MB=1024
LAB_TIMEOUT=600
LAB_TESTS=(tests/realkernel/sriov)
