# Lab "host" (lab 1): the distribution's default kernel (what linux-image-amd64 points at,
# bookworm's 6.1) with mtty, and the host's own root shared read-only over 9p: the tests
# run with the checkout's .venv, so a warm run only boots.  docs/design.md §12.
# Sourced by lab.sh; the variables are described in tests/realkernel/README.md (Profiles).
# shellcheck shell=bash disable=SC2034 # the variables are lab.sh's
LAB_KERNEL=default
LAB_ABI_ENV=ACCEL_REALKERNEL_ABI
LAB_ROOT=host
LAB_VENV=$REPO/.venv
LAB_MEMORY_MB=1024
# A busy 2-core machine (load 5) took 270 s for this suite of 22 tests; at load
# 5.5 with another TCG guest and two pytest workers beside it, 587 s: room for more.
LAB_TIMEOUT=900
LAB_MODULES=(vfio_iommu_type1 mtty)
LAB_QEMU_ARGS=()
LAB_APPEND=""
LAB_TESTS=(tests/realkernel --ignore=tests/realkernel/migration --ignore=tests/realkernel/systemd
	--ignore=tests/realkernel/sriov --ignore=tests/realkernel/libvirtdefs)
