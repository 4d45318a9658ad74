#!/usr/bin/env bash
# Real-kernel lab: boot Debian's stock kernel under QEMU (TCG) with the kernel's
# sample mdev driver mtty loaded, share the host's / read-only over 9p, and run a
# command inside the guest, chrooted into the host root.  By default the command
# is this directory's pytest suite; its junit XML comes back through a writable
# 9p share.  Recipe, measurements and caveats: research/mtty-lab.md.
#
# usage: lab.sh [-- COMMAND [ARG...]]
#   COMMAND runs in the guest as root, cwd = the repository, with the venv's bin/
#   first on PATH; e.g. `lab.sh -- accelctl --sysfs-root /sys types`.
#
# Everything comes from Debian packages (apt-get download + dpkg-deb -x): nothing
# is installed into the host's /boot and no module is loaded on the host.  Host
# tools (qemu-system-x86, cpio, and the compiler for the first build) are
# apt-get installed when missing.
#
# env:
#   ACCEL_REALKERNEL_CACHE    cache, outside the repo (default /var/cache/accel-agent-realkernel);
#                             one directory per kernel ABI holds vmlinux, mtty.ko and the
#                             other modules, busybox and the initrd, so warm runs only boot
#   ACCEL_REALKERNEL_ABI      kernel ABI, e.g. 6.1.0-56-amd64
#                             (default: what linux-image-amd64 depends on, looked up now)
#   ACCEL_REALKERNEL_RESULTS  results directory (default: tests/realkernel/results), shared
#                             read-write with the guest: realkernel.junit.xml, console.log
#                             (the guest's serial console), dmesg.log, guest-rc
#   ACCEL_REALKERNEL_TIMEOUT  seconds the guest may run (default 300)
#   ACCEL_REALKERNEL_PYTEST_ARGS  extra arguments for the default pytest command
#   LAB_REASON_FILE           (set by run.sh) where to write why the lab cannot run
#
# exit status: the guest command's; 75 = this host cannot run the lab (tools or
# packages cannot be installed or downloaded; run.sh reports a skip);
# 70 = the lab itself failed (build, boot, guest crash or timeout).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ACCEL_REALKERNEL_CACHE:-/var/cache/accel-agent-realkernel}
RESULTS=${ACCEL_REALKERNEL_RESULTS:-$HERE/results}
TIMEOUT=${ACCEL_REALKERNEL_TIMEOUT:-300}
VENV_PY=$REPO/.venv/bin/python
EX_LAB=70
EX_CANNOT=75
T0=$(date +%s%N)

stamp() { printf '[%5.1fs] realkernel: %s\n' "$((($(date +%s%N) - T0) / 1000000))e-3" "$*" >&2; }
die() { stamp "ERROR: $*"; exit $EX_LAB; }
cannot() {
	stamp "CANNOT RUN: $*"
	if [ -n "${LAB_REASON_FILE:-}" ]; then echo "$*" >"$LAB_REASON_FILE"; fi
	exit $EX_CANNOT
}
# Host-side Python for labtool.py: the project's interpreter, else any python3.
if [ -x "$VENV_PY" ]; then PY=$VENV_PY; else PY=$(command -v python3 || true); fi
labtool() { "$PY" "$HERE/labtool.py" "$@"; }

# Paths end up on the kernel command line and in a 9p mount: keep them simple.
for path in "$CACHE" "$RESULTS" "$REPO"; do
	[[ $path =~ ^/[A-Za-z0-9._/+-]+$ ]] || cannot "path '$path' must be absolute and free of spaces/specials"
done
[ -n "$PY" ] || cannot "no python3 on this host"

# --- host packages --------------------------------------------------------------

APT_UPDATED=0
apt_update() {
	[ "$APT_UPDATED" = 1 ] && return 0
	APT_UPDATED=1
	[ "$(id -u)" = 0 ] || return 1
	stamp "apt-get update"
	apt-get update -qq >/dev/null 2>&1
}

# ensure_packages PKG...: apt-get install the ones that are not installed yet.
ensure_packages() {
	local pkg missing=()
	for pkg in "$@"; do
		dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null | grep -qx installed || missing+=("$pkg")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" = 0 ] || cannot "missing host packages (${missing[*]}) and not root to install them"
	stamp "installing host packages: ${missing[*]}"
	local install=(apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}")
	if ! DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null 2>&1; then
		apt_update || true
		DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null ||
			cannot "apt-get install ${missing[*]} failed"
	fi
}

# --- which kernel -----------------------------------------------------------------

resolve_kernel() {
	ABI=${ACCEL_REALKERNEL_ABI:-}
	if [ -z "$ABI" ]; then
		ABI=$(apt-cache depends linux-image-amd64 2>/dev/null |
			sed -n 's/^ *Depends: linux-image-\(.*\)$/\1/p' | head -n1)
	fi
	VER=
	if [ -n "$ABI" ]; then
		VER=$(apt-cache policy "linux-image-$ABI-unsigned" 2>/dev/null | awk '/Candidate:/{print $2}')
	fi
	[ -n "$ABI" ] && [ -n "$VER" ] && [ "$VER" != "(none)" ]
}

# --- cold build: download, extract, build mtty.ko -------------------------------

# The five kernel packages of one version, plus busybox for the initramfs.
kernel_packages() {
	local short=${ABI%-amd64} series
	series=$(echo "$ABI" | cut -d. -f1-2) # 6.1.0-56-amd64 -> 6.1
	echo "linux-image-$ABI-unsigned=$VER linux-headers-$ABI=$VER" \
		"linux-headers-$short-common=$VER linux-kbuild-$series=$VER" \
		"linux-source-$series=$VER busybox-static"
}

# download_packages DIR: apt-get download into DIR (fails when the lists are stale).
download_packages() {
	local sandbox=()
	[ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root)
	# shellcheck disable=SC2046 # kernel_packages prints a list of words
	(cd "$1" && apt-get download -qq "${sandbox[@]}" $(kernel_packages) >/dev/null 2>&1)
}

# What the headers need to build a module: their compiler package's dependencies
# (linux-compiler-gcc-12-x86 -> gcc-12), make, and kbuild's prebuilt tools' libraries.
ensure_build_tools() {
	local compiler tools
	compiler=$(apt-cache depends "linux-headers-$ABI" 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-compiler-.*\)$/\1/p' | head -n1)
	tools=$(apt-cache depends "${compiler:-none}" 2>/dev/null | sed -n 's/^ *Depends: //p')
	# shellcheck disable=SC2086 # a list of package names
	ensure_packages ${tools:-gcc-12} make libc6-dev binutils libelf1 libssl3 xz-utils
}

# build_kernel_dir DEST BUILD: fill DEST with everything the guest needs from the
# packages downloaded into BUILD/debs.
build_kernel_dir() {
	local dest=$1 build=$2
	local series
	series=$(echo "$ABI" | cut -d. -f1-2)
	local debs=$build/debs root=$build/root
	mkdir -p "$root" "$build/mtty" "$dest/ko"
	ensure_build_tools

	# mtty.c is not built by Debian (CONFIG_SAMPLES is off): stream the one file out of
	# the source tarball (~10 s of xz) in the background while the rest is extracted.
	# tar stops at the first match (--occurrence), so the pipe breaks on purpose.
	(
		set +o pipefail
		dpkg-deb --fsys-tarfile "$debs"/linux-source-"$series"_*.deb 2>/dev/null |
			tar -xO "./usr/src/linux-source-$series.tar.xz" | xz -dc |
			tar -xO --occurrence=1 "linux-source-$series/samples/vfio-mdev/mtty.c" \
				>"$build/mtty/mtty.c" 2>/dev/null
		true
	) &
	local srcpid=$!

	dpkg-deb --fsys-tarfile "$debs"/linux-image-"$ABI"-unsigned_*.deb |
		labtool untar-image "$ABI" "$dest" || die "extracting the kernel image failed"
	for deb in "$debs"/linux-headers-*.deb "$debs"/linux-kbuild-*.deb; do
		dpkg-deb -x "$deb" "$root"
	done
	dpkg-deb --fsys-tarfile "$debs"/busybox-static_*.deb | tar -x -C "$build" ./bin/busybox
	mv "$build/bin/busybox" "$dest/busybox"
	labtool vmlinux "$dest/vmlinuz" "$dest/vmlinux" || die "decompressing vmlinuz failed"
	rm -f "$dest/vmlinuz"
	# The headers' Makefile includes the -common tree by absolute path: repoint it.
	sed -i "s|^include /usr/src/|include $root/usr/src/|" "$root/usr/src/linux-headers-$ABI/Makefile"
	wait "$srcpid" || true
	grep -q 'MODULE_LICENSE' "$build/mtty/mtty.c" 2>/dev/null ||
		die "samples/vfio-mdev/mtty.c not found in linux-source-$series"
	stamp "extracted"

	echo 'obj-m := mtty.o' >"$build/mtty/Kbuild"
	make -s -C "$root/usr/src/linux-headers-$ABI" M="$build/mtty" modules >"$build/make.log" 2>&1 ||
		{ cat "$build/make.log" >&2; die "building mtty.ko failed"; }
	cp "$build/mtty/mtty.ko" "$dest/ko/"
	cp "$build/mtty/mtty.c" "$dest/" # for reference: what the module was built from
	stamp "built mtty.ko"

	# insmod order, dependencies first, from each .ko's .modinfo depends=
	labtool modorder "$dest/ko" "$dest/modules.builtin" vfio_iommu_type1 mtty >"$dest/mdev.order" ||
		die "module order (mdev)"
	labtool modorder "$dest/ko" "$dest/modules.builtin" virtio_pci 9pnet_virtio 9p >"$dest/9p.order" ||
		die "module order (9p)"
	printf 'abi=%s\nversion=%s\n' "$ABI" "$VER" >"$dest/kernel"
}

# --- initramfs ----------------------------------------------------------------------

# build_initrd KDIR OUT: busybox + the ordered modules + init.sh as /init.
build_initrd() {
	local kdir=$1 out=$2 tree m
	ensure_packages cpio
	tree=$(mktemp -d "$CACHE/initramfs.XXXXXX")
	mkdir -p "$tree"/{bin,lib/modules,proc,sys,dev,mnt/host}
	cp "$kdir/busybox" "$tree/bin/busybox"
	cp "$kdir/mdev.order" "$kdir/9p.order" "$tree/lib/modules/"
	# shellcheck disable=SC2013 # the order files are one line of words
	for m in $(cat "$kdir/mdev.order" "$kdir/9p.order"); do
		cp "$kdir/ko/$m.ko" "$tree/lib/modules/"
	done
	install -m 0755 "$HERE/init.sh" "$tree/init"
	(cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1) >"$out.tmp"
	mv "$out.tmp" "$out"
	rm -rf "$tree"
}

# --- main -----------------------------------------------------------------------------

mkdir -p "$CACHE" 2>/dev/null || cannot "cannot create the cache directory $CACHE"
[ -w "$CACHE" ] || cannot "cache directory $CACHE is not writable (set ACCEL_REALKERNEL_CACHE)"
# One lab at a time per cache (two checkouts or CI jobs on one machine).
exec 9>"$CACHE/.lock"
flock -w 900 9 || die "timed out waiting for the lock on $CACHE"

QEMU_PID_FILE='' QPID=''
BUILD_DIR=''
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local pid
	if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then kill "$QPID" 2>/dev/null || true; fi
	if [ -n "$QEMU_PID_FILE" ] && [ -s "$QEMU_PID_FILE" ]; then
		pid=$(cat "$QEMU_PID_FILE" 2>/dev/null || true)
		if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = qemu-system-x86 ]; then
			kill "$pid" 2>/dev/null || true
		fi
	fi
	if [ -n "$BUILD_DIR" ]; then rm -rf "$BUILD_DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# leftovers of a run that was killed (the lock is ours now)
rm -rf "$CACHE"/build.* "$CACHE"/initramfs.*

if ! command -v apt-cache >/dev/null || ! command -v dpkg-deb >/dev/null; then
	cannot "not a Debian/APT host"
fi
ensure_packages qemu-system-x86
QEMU=$(command -v qemu-system-x86_64) || cannot "qemu-system-x86_64 not found after installing it"
if ! resolve_kernel; then
	apt_update || true
	resolve_kernel || cannot "no linux-image-amd64 / linux-image-${ABI:-?}-unsigned in the APT sources"
fi
KDIR=$CACHE/${ABI}_$VER
if [ -f "$KDIR/kernel" ]; then
	stamp "kernel $ABI ($VER): cached in $KDIR"
else
	BUILD_DIR=$(mktemp -d "$CACHE/build.XXXXXX")
	mkdir -p "$BUILD_DIR/debs"
	stamp "kernel $ABI ($VER): not cached; downloading its packages"
	if ! download_packages "$BUILD_DIR/debs"; then
		# Stale package lists name versions the mirror no longer has: refresh once.
		apt_update || cannot "apt-get download failed (and cannot apt-get update as non-root)"
		resolve_kernel || cannot "no linux-image-amd64 / linux-image-${ABI:-?}-unsigned after apt-get update"
		KDIR=$CACHE/${ABI}_$VER
		stamp "kernel $ABI ($VER) after apt-get update; downloading its packages"
		download_packages "$BUILD_DIR/debs" || cannot "apt-get download $(kernel_packages) failed"
	fi
	stamp "downloaded $(du -sh "$BUILD_DIR/debs" | cut -f1); building $KDIR"
	build_kernel_dir "$BUILD_DIR/kernel" "$BUILD_DIR"
	rm -rf "$KDIR"
	mv "$BUILD_DIR/kernel" "$KDIR"
	rm -rf "$BUILD_DIR"
	BUILD_DIR=
	# keep one kernel: older ABIs (security updates) only cost disk
	for old in "$CACHE"/*/kernel; do
		[ "${old%/kernel}" = "$KDIR" ] || rm -rf "${old%/kernel}"
	done
fi

INITRD=$KDIR/initrd-$(cat "$HERE/init.sh" "$KDIR/mdev.order" "$KDIR/9p.order" |
	sha256sum | cut -c1-12).img
if [ ! -f "$INITRD" ]; then
	rm -f "$KDIR"/initrd-*.img
	build_initrd "$KDIR" "$INITRD"
	stamp "initrd built ($(du -h "$INITRD" | cut -f1))"
fi

# Results: the previous run's files go, then the guest's command script is written
# into it (the guest sees the same path through the writable 9p share).
mkdir -p "$RESULTS"
rm -f "$RESULTS"/{realkernel.junit.xml,console.log,dmesg.log,guest-cmd.sh,guest-rc,guest-error,qemu.pid}
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
if [ $# -eq 0 ]; then
	# shellcheck disable=SC2206 # word splitting of the extra arguments is intended
	extra=(${ACCEL_REALKERNEL_PYTEST_ARGS:-})
	set -- env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$VENV_PY" -m pytest tests/realkernel \
		-p no:cacheprovider -q -rfEs --color=no \
		--junitxml="$RESULTS/realkernel.junit.xml" "${extra[@]}"
fi
{
	echo '#!/bin/bash'
	echo '# written by tests/realkernel/lab.sh; runs in the guest, chrooted into the host root'
	printf 'cd %q || exit 97\n' "$REPO"
	# shellcheck disable=SC2016 # $PATH is for the guest's shell
	printf 'export PATH=%q:"$PATH"\n' "$REPO/.venv/bin"
	printf 'exec'
	printf ' %q' "$@"
	echo
} >"$RESULTS/guest-cmd.sh"

QEMU_PID_FILE=$RESULTS/qemu.pid
APPEND="console=ttyS0 panic=-1 quiet lab_out=$RESULTS lab_cmd=$RESULTS/guest-cmd.sh lab_repo=$REPO"
stamp "booting $ABI under QEMU (TCG), timeout ${TIMEOUT}s"
# TCG: /dev/kvm on this kind of machine cannot run an unmodified kernel (mtty-lab.md,
# Blockers), and the guest's work is small.  vmlinux boots through PVH (no firmware).
# QEMU does not exit on some errors (the VM just pauses): always under timeout.
timeout --kill-after=10 "$TIMEOUT" "$QEMU" \
	-accel tcg -cpu max -smp 2 -m 1024 \
	-nodefaults -no-user-config -display none -no-reboot -monitor none \
	-serial stdio -pidfile "$QEMU_PID_FILE" \
	-kernel "$KDIR/vmlinux" -initrd "$INITRD" -append "$APPEND" \
	-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
	-virtfs "local,path=$RESULTS,mount_tag=results,security_model=none" \
	</dev/null >"$RESULTS/console.log" 2>&1 &
QPID=$!
qrc=0
wait "$QPID" || qrc=$?
QPID=
stamp "guest exited"

if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
	die "the guest did not finish within ${TIMEOUT}s (console: $RESULTS/console.log)"
fi
if [ ! -s "$RESULTS/guest-rc" ]; then
	die "the guest reported no exit status (QEMU rc=$qrc; console: $RESULTS/console.log)"
fi
if [ -s "$RESULTS/guest-error" ]; then
	die "in the guest: $(cat "$RESULTS/guest-error") (console: $RESULTS/console.log)"
fi
rc=$(cat "$RESULTS/guest-rc")
stamp "guest command exit status $rc"
exit "$rc"
