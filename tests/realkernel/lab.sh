#!/usr/bin/env bash
# Real-kernel lab: boot a Debian kernel under QEMU (TCG) with the kernel's sample mdev
# driver mtty loaded and run a command inside the guest, by default one pytest tier.
# Which kernel and which userland is a lab profile, labs/NAME.sh (README.md, Profiles):
#
#   host    (default) the distribution's default kernel; the guest chroots into the host's
#           own / shared read-only over 9p and runs the checkout's .venv
#           (docs/design.md §12);
#   trixie  Debian's 6.12 kernel from bookworm-security and a trixie userland (QEMU 10,
#           libvirt 11) made by mmdebstrap into the cache, the agent installed in a venv
#           inside it; the guest's root is that tree, read-only over 9p under a tmpfs
#           overlay (docs/design.md §7.4, §12).
#
# usage: lab.sh [--lab NAME] [-- COMMAND [ARG...]]
#   COMMAND runs in the guest as root, cwd = the repository (shared read-only), with the
#   lab's venv bin/ first on PATH; e.g. `lab.sh -- accelctl --sysfs-root /sys types`.
#
# Everything comes from Debian packages (apt-get download + dpkg-deb -x, and mmdebstrap for
# a rootfs) and PyPI (the rootfs's wheelhouse): nothing is installed into the host's /boot,
# no module is loaded on the host, the host's APT sources are never changed (a rootfs has a
# private APT configuration under the cache).  Host tools (qemu-system-x86, cpio, zstd and
# the compiler for the first build) are apt-get installed when missing.
#
# env:
#   ACCEL_REALKERNEL_LAB      the lab profile when --lab is not given (default host)
#   ACCEL_REALKERNEL_CACHE    cache, outside the repo (default /var/cache/accel-agent-realkernel);
#                             per kernel ABI: vmlinux, mtty.ko and the other modules, busybox and
#                             the initrd; per rootfs key: the tree with its venv; flock'd, so
#                             labs on one machine run one at a time
#   ACCEL_REALKERNEL_ABI      kernel ABI of lab host, e.g. 6.1.0-56-amd64 (default: what
#                             linux-image-amd64 depends on, looked up now);
#   ACCEL_REALKERNEL_TRIXIE_ABI  the same for lab trixie (default: the newest 6.12 ABI)
#   ACCEL_REALKERNEL_RESULTS  results base directory (default tests/realkernel/results); the lab
#                             NAME writes into NAME/ under it, shared read-write with the guest:
#                             realkernel.junit.xml, console.log (the guest's serial console),
#                             dmesg.log, guest-rc, logs/ (what the tests keep, e.g. agents' logs)
#   ACCEL_REALKERNEL_TIMEOUT  seconds the guest may run (default: the lab's LAB_TIMEOUT)
#   ACCEL_REALKERNEL_PYTEST_ARGS  extra arguments for the default pytest command
#   ACCEL_REALKERNEL_APT_MAX_AGE  days a rootfs's private package lists are used before they
#                             are fetched again (default 7; newer versions make a new rootfs)
#   LAB_REASON_FILE           (set by run.sh) where to write why the lab cannot run
#
# exit status: the guest command's; 75 = this host cannot run the lab (tools or
# packages cannot be installed or downloaded; run.sh reports a skip);
# 70 = the lab itself failed (build, boot, guest crash or timeout).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LAB=${ACCEL_REALKERNEL_LAB:-host}
if [ $# -gt 1 ] && [ "$1" = "--lab" ]; then
	LAB=$2
	shift 2
fi
CACHE=${ACCEL_REALKERNEL_CACHE:-/var/cache/accel-agent-realkernel}
RESULTS=${ACCEL_REALKERNEL_RESULTS:-$HERE/results}/$LAB
VENV_PY=$REPO/.venv/bin/python
APT_MAX_AGE=${ACCEL_REALKERNEL_APT_MAX_AGE:-7}
EX_LAB=70
EX_CANNOT=75
T0=$(date +%s%N)

stamp() { printf '[%5.1fs] realkernel %s: %s\n' "$((($(date +%s%N) - T0) / 1000000))e-3" "$LAB" "$*" >&2; }
die() { stamp "ERROR: $*"; exit $EX_LAB; }
cannot() {
	stamp "CANNOT RUN: $*"
	if [ -n "${LAB_REASON_FILE:-}" ]; then echo "$*" >"$LAB_REASON_FILE"; fi
	exit $EX_CANNOT
}

[[ $LAB =~ ^[a-z0-9-]+$ ]] && [ -f "$HERE/labs/$LAB.sh" ] ||
	cannot "no lab profile '$LAB' (tests/realkernel/labs/*.sh)"
# shellcheck source=labs/host.sh
. "$HERE/labs/$LAB.sh"
# Optional profile variables (README.md, Profiles), off unless a profile sets them.
LAB_INIT=${LAB_INIT:-chroot}
LAB_DEB=${LAB_DEB:-0}
LAB_DISK_MB=${LAB_DISK_MB:-0}
LAB_GUEST_REBOOTS=${LAB_GUEST_REBOOTS:-0}
LAB_GUEST_SCRIPT=${LAB_GUEST_SCRIPT:-}
LAB_VENV=${LAB_VENV:-}
[ -n "${LAB_DEBIAN_PYTHON+set}" ] || LAB_DEBIAN_PYTHON=()
TIMEOUT=${ACCEL_REALKERNEL_TIMEOUT:-$LAB_TIMEOUT}

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

# Sets ABI and VER.  LAB_KERNEL=default: what linux-image-amd64 depends on; a series such as
# 6.12: the newest linux-image-6.12.*-amd64-unsigned the APT sources offer (bookworm-security
# carries Debian's 6.12 as linux-image-6.12.N+deb12-amd64-unsigned).
resolve_kernel() {
	ABI=${!LAB_ABI_ENV:-}
	if [ -z "$ABI" ] && [ "$LAB_KERNEL" = default ]; then
		ABI=$(apt-cache depends linux-image-amd64 2>/dev/null |
			sed -n 's/^ *Depends: linux-image-\(.*\)$/\1/p' | head -n1)
	elif [ -z "$ABI" ]; then
		ABI=$(apt-cache pkgnames "linux-image-$LAB_KERNEL." 2>/dev/null |
			grep -E "^linux-image-${LAB_KERNEL//./\\.}\.[0-9]+\+deb[0-9]+-amd64-unsigned$" |
			sed 's/^linux-image-//; s/-unsigned$//' | sort -V | tail -n1)
	fi
	VER=
	if [ -n "$ABI" ]; then
		VER=$(apt-cache policy "linux-image-$ABI-unsigned" 2>/dev/null | awk '/Candidate:/{print $2}')
	fi
	[ -n "$ABI" ] && [ -n "$VER" ] && [ "$VER" != "(none)" ]
}

# --- cold build: download, extract, build mtty.ko -------------------------------

# The kernel packages of one version: image, headers with the -common headers and kbuild
# they depend on (named differently per series: linux-kbuild-6.1, linux-kbuild-6.12.117+deb12),
# the source, plus busybox for the initramfs.
kernel_packages() {
	local series deps
	series=$(echo "$ABI" | cut -d. -f1-2) # 6.1.0-56-amd64 -> 6.1
	deps=$(apt-cache depends "linux-headers-$ABI" 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-headers-.*-common\|linux-kbuild-.*\)$/\1/p' | sort -u)
	echo "linux-image-$ABI-unsigned=$VER linux-headers-$ABI=$VER linux-source-$series=$VER"
	for pkg in $deps; do echo "$pkg=$VER"; done
	echo busybox-static
}

# download_packages DIR: apt-get download into DIR (fails when the lists are stale).
download_packages() {
	local sandbox=()
	[ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root)
	# shellcheck disable=SC2046 # kernel_packages prints a list of words
	(cd "$1" && apt-get download -qq "${sandbox[@]}" $(kernel_packages) >/dev/null 2>&1)
}

# What the headers need to build a module: their compiler (6.1: linux-compiler-gcc-12-x86
# and its dependencies; 6.12: gcc-12 directly), make, and kbuild's tools' libraries.
ensure_build_tools() {
	local compiler tools
	compiler=$(apt-cache depends "linux-headers-$ABI" 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-compiler-.*\)$/\1/p' | head -n1)
	if [ -n "$compiler" ]; then
		tools=$(apt-cache depends "$compiler" 2>/dev/null | sed -n 's/^ *Depends: //p')
	else
		tools=$(apt-cache depends "linux-headers-$ABI" 2>/dev/null |
			sed -n 's/^ *Depends: \(gcc-[0-9]*\)$/\1/p')
	fi
	# shellcheck disable=SC2086 # a list of package names
	ensure_packages ${tools:-gcc-12} make libc6-dev binutils libelf1 libssl3 xz-utils zstd
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

	# Built uncompressed (the kernel's own xz cannot read a host-xz'd module: crc64), and
	# without BTF (that would need pahole on the host; the lab has no use for it).
	echo 'obj-m := mtty.o' >"$build/mtty/Kbuild"
	make -s -C "$root/usr/src/linux-headers-$ABI" M="$build/mtty" CONFIG_DEBUG_INFO_BTF_MODULES= \
		modules >"$build/make.log" 2>&1 ||
		{ cat "$build/make.log" >&2; die "building mtty.ko failed"; }
	cp "$build/mtty/mtty.ko" "$dest/ko/"
	cp "$build/mtty/mtty.c" "$dest/" # for reference: what the module was built from
	stamp "built mtty.ko"

	# insmod order, dependencies first, from each .ko's .modinfo depends= (the lab's own
	# LAB_MODULES: lab_module_order, per run, since labs share a kernel)
	labtool modorder "$dest/ko" "$dest/modules.builtin" 9pnet_virtio 9p virtio_pci >"$dest/9p.order" ||
		die "module order (9p)"
	labtool modorder "$dest/ko" "$dest/modules.builtin" overlay >"$dest/overlay.order" ||
		die "module order (overlay)"
	printf 'abi=%s\nversion=%s\nselector=%s\n' "$ABI" "$VER" "$LAB_KERNEL" >"$dest/kernel"
}

# lab_module_order: the insmod order of this lab's LAB_MODULES in the kernel KDIR (fails
# when one of them was not extracted: a kernel cached before MODULE_DIRS named its folder).
lab_module_order() {
	labtool modorder "$KDIR/ko" "$KDIR/modules.builtin" "${LAB_MODULES[@]}"
}

# ensure_kernel: KDIR = the cached kernel of this lab, built on first use.
ensure_kernel() {
	if ! resolve_kernel; then
		apt_update || true
		resolve_kernel || cannot "no kernel for LAB_KERNEL=$LAB_KERNEL (${ABI:-?}) in the APT sources"
	fi
	KDIR=$CACHE/${ABI}_$VER
	if [ -f "$KDIR/kernel" ] && [ -f "$KDIR/overlay.order" ]; then
		if lab_module_order >/dev/null 2>&1; then
			stamp "kernel $ABI ($VER): cached in $KDIR"
			return
		fi
		stamp "kernel $ABI ($VER): the cached one lacks modules of this lab; building it again"
	fi
	BUILD_DIR=$(mktemp -d "$CACHE/build.XXXXXX")
	mkdir -p "$BUILD_DIR/debs"
	stamp "kernel $ABI ($VER): not cached; downloading its packages"
	if ! download_packages "$BUILD_DIR/debs"; then
		# Stale package lists name versions the mirror no longer has: refresh once.
		apt_update || cannot "apt-get download failed (and cannot apt-get update as non-root)"
		resolve_kernel || cannot "no kernel for LAB_KERNEL=$LAB_KERNEL after apt-get update"
		KDIR=$CACHE/${ABI}_$VER
		stamp "kernel $ABI ($VER) after apt-get update; downloading its packages"
		download_packages "$BUILD_DIR/debs" || cannot "apt-get download $(kernel_packages | xargs) failed"
	fi
	stamp "downloaded $(du -sh "$BUILD_DIR/debs" | cut -f1); building $KDIR"
	build_kernel_dir "$BUILD_DIR/kernel" "$BUILD_DIR"
	rm -rf "$KDIR"
	mv "$BUILD_DIR/kernel" "$KDIR"
	rm -rf "$BUILD_DIR"
	BUILD_DIR=
	# Keep one kernel per selector (security updates bump the ABI; old ones only cost disk),
	# never another lab's.
	local old selector
	for old in "$CACHE"/*/kernel; do
		[ -f "$old" ] && [ "${old%/kernel}" != "$KDIR" ] || continue
		selector=$(sed -n 's/^selector=//p' "$old")
		if [ "${selector:-default}" = "$LAB_KERNEL" ]; then rm -rf "${old%/kernel}"; fi
	done
	return 0
}

# --- a rootfs: the lab's userland, made by mmdebstrap from the Debian archive -----------

# The Debian archive the host's APT uses for its own release (never written to; only read
# to point a private APT configuration and mmdebstrap at the same mirror).
archive_mirror() {
	local codename
	codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	apt-get indextargets --format '$(SITE) $(RELEASE) $(COMPONENT)' 2>/dev/null |
		awk -v c="$codename" '$2 == c && $3 == "main" { print $1; exit }'
}

# mmdebstrap is a Perl script: the host's own package, extracted into the cache, not installed.
ensure_mmdebstrap() {
	local version
	version=$(apt-cache policy mmdebstrap 2>/dev/null | awk '/Candidate:/{print $2}')
	if [ -z "$version" ] || [ "$version" = "(none)" ]; then
		apt_update || true
		version=$(apt-cache policy mmdebstrap 2>/dev/null | awk '/Candidate:/{print $2}')
	fi
	[ -n "$version" ] && [ "$version" != "(none)" ] || cannot "no mmdebstrap in the APT sources"
	MMDEBSTRAP_DIR=$CACHE/tools/mmdebstrap_$version
	[ -x "$MMDEBSTRAP_DIR/usr/bin/mmdebstrap" ] && return
	local tmp
	tmp=$(mktemp -d "$CACHE/build.XXXXXX")
	(cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "mmdebstrap=$version" >/dev/null 2>&1) ||
		cannot "apt-get download mmdebstrap failed"
	mkdir -p "$CACHE/tools"
	rm -rf "$CACHE"/tools/mmdebstrap_*
	dpkg-deb -x "$tmp"/mmdebstrap_*.deb "$MMDEBSTRAP_DIR"
	rm -rf "$tmp"
}

# private_apt ARGS...: the host's apt-get/apt-cache against the lab suite's own sources,
# lists, cache and an empty dpkg status, all under the cache: the host's sources, lists and
# status are never read or written.
private_apt() {
	local tool=$1
	shift
	"$tool" -o Dir::Etc::sourcelist="$APT_DIR/sources.list" -o Dir::Etc::sourceparts="$APT_DIR/empty" \
		-o Dir::Etc::preferencesparts="$APT_DIR/empty" -o Dir::State::Lists="$APT_DIR/lists" \
		-o Dir::Cache="$APT_DIR/cache" -o Dir::State::status="$APT_DIR/status" \
		-o APT::Sandbox::User=root -o Debug::NoLocking=1 "$@"
}

# The package lists of the lab's suite, fetched when missing or older than APT_MAX_AGE days.
ensure_suite_lists() {
	APT_DIR=$CACHE/apt-$LAB_SUITE
	MIRROR=$(archive_mirror)
	if [ -z "$MIRROR" ]; then
		apt_update || true
		MIRROR=$(archive_mirror)
	fi
	[ -n "$MIRROR" ] || cannot "cannot tell the host's Debian mirror (apt-get indextargets)"
	mkdir -p "$APT_DIR"/{empty,lists/partial,cache/archives/partial}
	: >>"$APT_DIR/status"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $LAB_SUITE main" \
		>"$APT_DIR/sources.list.new"
	local fresh
	fresh=$(find "$APT_DIR/lists" -maxdepth 1 -name '*_InRelease' -mtime "-$APT_MAX_AGE" 2>/dev/null | head -n1)
	if cmp -s "$APT_DIR/sources.list.new" "$APT_DIR/sources.list" && [ -n "$fresh" ]; then
		rm -f "$APT_DIR/sources.list.new"
		return
	fi
	mv "$APT_DIR/sources.list.new" "$APT_DIR/sources.list"
	stamp "fetching the $LAB_SUITE package lists (private APT configuration in $APT_DIR)"
	private_apt apt-get update -qq >/dev/null 2>&1 || cannot "apt-get update of $LAB_SUITE failed ($MIRROR)"
}

# The rootfs key: what the recipe asks for and every version APT would install for it.
rootfs_key() {
	{
		echo "recipe 1: mmdebstrap --variant=apt, $LAB_SUITE main"
		echo "mmdebstrap ${MMDEBSTRAP_DIR##*_}"
		printf '%s\n' "${LAB_ROOTFS_PACKAGES[@]}"
		private_apt apt-get install -s -qq --no-install-recommends "${LAB_ROOTFS_PACKAGES[@]}" 2>&1 |
			awk '/^Inst / { print $2, $3 }'
	} | sha256sum | cut -c1-16
}

# ensure_rootfs: ROOTFS = the cached tree of this lab's userland, built on first use.
ensure_rootfs() {
	ensure_packages perl
	ensure_mmdebstrap
	ensure_suite_lists
	local key
	key=$(rootfs_key)
	ROOTFS_DIR=$CACHE/rootfs-$LAB_SUITE-$key
	ROOTFS=$ROOTFS_DIR/root
	if [ -f "$ROOTFS_DIR/packages.txt" ]; then
		stamp "rootfs $LAB_SUITE: cached in $ROOTFS_DIR"
		return
	fi
	stamp "rootfs $LAB_SUITE ($key): not cached; mmdebstrap from $MIRROR"
	BUILD_DIR=$(mktemp -d "$CACHE/build.XXXXXX")
	local proxy opts=()
	for proxy in http https; do
		value=$(apt-config dump "Acquire::$proxy::Proxy" 2>/dev/null | sed -n 's/^[^ ]* "\(.*\)";$/\1/p' | head -n1)
		[ -z "$value" ] || opts+=("--aptopt=Acquire::$proxy::Proxy \"$value\"")
	done
	local include
	include=$(
		IFS=,
		echo "${LAB_ROOTFS_PACKAGES[*]}"
	)
	perl "$MMDEBSTRAP_DIR/usr/bin/mmdebstrap" --mode=root --variant=apt --quiet \
		--keyring=/usr/share/keyrings/debian-archive-keyring.gpg "${opts[@]}" \
		--include="$include" "$LAB_SUITE" "$BUILD_DIR/root" \
		"deb $MIRROR $LAB_SUITE main" >"$BUILD_DIR/mmdebstrap.log" 2>&1 || {
		tail -n 20 "$BUILD_DIR/mmdebstrap.log" >&2
		# The lists may name versions the mirror dropped: the next run fetches them again.
		rm -f "$APT_DIR"/lists/*_InRelease
		cannot "mmdebstrap of $LAB_SUITE failed"
	}
	chroot "$BUILD_DIR/root" dpkg-query -W >"$BUILD_DIR/packages.txt"
	rm -rf "$ROOTFS_DIR"
	mv "$BUILD_DIR" "$ROOTFS_DIR"
	BUILD_DIR=
	stamp "rootfs built: $(du -sh "$ROOTFS" | cut -f1), $(wc -l <"$ROOTFS_DIR/packages.txt") packages"
	local old
	for old in "$CACHE"/rootfs-"$LAB_SUITE"-*; do
		[ "$old" = "$ROOTFS_DIR" ] || rm -rf "$old"
	done
}

# in_rootfs COMMAND...: run in the rootfs on the host, with a clean environment.
in_rootfs() {
	env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
		PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 "${PIP_ENV[@]}" chroot "$ROOTFS" "$@"
}

# The host's pip network settings, for the rootfs's pip: its CA bundle (a proxy that
# re-signs TLS is trusted by it), its proxies, an http(s) index it names.
pip_network_env() {
	local cert index
	PIP_ENV=()
	cert=${PIP_CERT:-$("$PY" -m pip config get global.cert 2>/dev/null || true)}
	[ -f "$cert" ] || cert=/etc/ssl/certs/ca-certificates.crt
	if [ -f "$cert" ]; then
		cp "$cert" "$ROOTFS/tmp/lab-ca.crt"
		PIP_ENV+=(PIP_CERT=/tmp/lab-ca.crt)
	fi
	cp /etc/resolv.conf "$ROOTFS/tmp/lab-resolv.conf" 2>/dev/null || true
	index=${PIP_INDEX_URL:-$("$PY" -m pip config get global.index-url 2>/dev/null || true)}
	[[ $index =~ ^https?:// ]] && PIP_ENV+=("PIP_INDEX_URL=$index")
	for var in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
		[ -z "${!var:-}" ] || PIP_ENV+=("$var=${!var}")
	done
}

# ensure_venv: the agent's dependencies in LAB_VENV inside the rootfs, from a wheelhouse
# that the rootfs's own pip resolved (its Python, its markers) and downloaded from PyPI once.
ensure_venv() {
	local reqs python key wheelhouse
	PIP_ENV=()
	reqs=$(labtool requirements "$REPO/pyproject.toml" "${LAB_DEBIAN_PYTHON[@]}")
	python=$(in_rootfs python3 -c 'import sys; print(sys.version.split()[0])')
	key=$({
		echo "python $python"
		echo "$reqs"
		grep -viE "^($(
			IFS='|'
			echo "${LAB_DEBIAN_PYTHON[*]}"
		))==" "$REPO/constraints.txt"
	} | sha256sum | cut -c1-16)
	wheelhouse=$CACHE/wheelhouse-$LAB_SUITE-$key
	if [ "$(cat "$ROOTFS_DIR/venv.key" 2>/dev/null)" = "$key" ]; then
		stamp "venv $LAB_VENV ($key): cached"
		return
	fi
	mkdir -p "$ROOTFS/tmp/lab-wheels"
	echo "$reqs" >"$ROOTFS/tmp/lab-wheels/requirements.txt"
	grep -viE "^($(
		IFS='|'
		echo "${LAB_DEBIAN_PYTHON[*]}"
	))==" "$REPO/constraints.txt" >"$ROOTFS/tmp/lab-wheels/constraints.txt"
	rm -rf "$ROOTFS$LAB_VENV"
	in_rootfs python3 -m venv --system-site-packages "$LAB_VENV" || die "python3 -m venv in the rootfs failed"
	if [ ! -f "$wheelhouse/complete" ]; then
		stamp "wheelhouse for Python $python: pip download (PyPI) into $wheelhouse"
		pip_network_env
		# resolv.conf of the rootfs is the one mmdebstrap saw; use the host's current one.
		cp "$ROOTFS/etc/resolv.conf" "$ROOTFS/tmp/lab-resolv.orig" 2>/dev/null || true
		cp "$ROOTFS/tmp/lab-resolv.conf" "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
		local rc=0
		in_rootfs "$LAB_VENV/bin/pip" download -q -d /tmp/lab-wheels/dl \
			-c /tmp/lab-wheels/constraints.txt -r /tmp/lab-wheels/requirements.txt setuptools ||
			rc=$?
		cp "$ROOTFS/tmp/lab-resolv.orig" "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
		rm -f "$ROOTFS"/tmp/lab-ca.crt "$ROOTFS"/tmp/lab-resolv.*
		[ "$rc" = 0 ] || cannot "pip download of the agent's dependencies (Python $python) failed"
		rm -rf "$wheelhouse"
		mkdir -p "$wheelhouse"
		mv "$ROOTFS"/tmp/lab-wheels/dl/* "$wheelhouse/"
		touch "$wheelhouse/complete"
	fi
	# Keep the three most recently used wheelhouses of the suite, not just this one:
	# checkouts whose dependencies differ (a branch, main, CI) take turns on this cache,
	# and each turn would otherwise download the other's from PyPI again.
	touch "$wheelhouse"
	local old
	# shellcheck disable=SC2012 # names are ours: wheelhouse-<suite>-<hex>
	for old in $(ls -dt "$CACHE"/wheelhouse-"$LAB_SUITE"-* | tail -n +4); do
		rm -rf "$old"
	done
	mkdir -p "$ROOTFS/tmp/lab-wheels/wh"
	cp "$wheelhouse"/*.whl "$ROOTFS/tmp/lab-wheels/wh/"
	PIP_ENV=()
	in_rootfs "$LAB_VENV/bin/pip" install -q --no-index --find-links /tmp/lab-wheels/wh \
		-c /tmp/lab-wheels/constraints.txt -r /tmp/lab-wheels/requirements.txt setuptools ||
		die "pip install of the wheelhouse into $LAB_VENV failed"
	rm -rf "$ROOTFS/tmp/lab-wheels"
	echo "$key" >"$ROOTFS_DIR/venv.key"
	stamp "venv $LAB_VENV built ($(du -sh "$ROOTFS$LAB_VENV" | cut -f1))"
}

# install_agent: this checkout, built into a wheel and installed into LAB_VENV (no
# dependencies, no network).  Only the files the build reads are copied in, so the build
# leaves nothing in the checkout.  Every run installs the checkout it runs from.
install_agent() {
	local src=$ROOTFS/tmp/accel-agent-src
	rm -rf "$src"
	mkdir -p "$src"
	cp "$REPO/pyproject.toml" "$REPO/README.md" "$src/"
	tar -C "$REPO" --exclude=__pycache__ -cf - accel_agent | tar -C "$src" -xf -
	PIP_ENV=()
	in_rootfs "$LAB_VENV/bin/pip" install -q --no-deps --no-index --no-build-isolation \
		--force-reinstall /tmp/accel-agent-src >"$RESULTS/agent-install.log" 2>&1 ||
		{ cat "$RESULTS/agent-install.log" >&2; die "installing the checkout into $LAB_VENV failed"; }
	rm -rf "$src"
	stamp "agent $(in_rootfs "$LAB_VENV/bin/python" -c \
		'import importlib.metadata as m; print(m.version("accel-agent"))') installed into $LAB_VENV"
}

# --- the Debian package (LAB_DEB=1) -----------------------------------------------------

# ensure_deb: DEB = dist/accel-agent_*.deb of this checkout, built by `make deb` when it is
# missing or older than anything it is built from (tools/deb-fresh.sh, the package tier's
# rule and lock too: in `make test` both run at once).  Its Depends and Recommends join
# the rootfs's packages: the guest installs it with apt, offline.
ensure_deb() {
	local found=()
	stamp "the Debian package: make deb unless dist/'s is newer than its sources (tools/deb-fresh.sh)"
	MAKE=make bash "$REPO/tools/deb-fresh.sh" >"$RESULTS/make-deb.log" 2>&1 ||
		{ tail -n 30 "$RESULTS/make-deb.log" >&2; die "make deb failed ($RESULTS/make-deb.log)"; }
	shopt -s nullglob
	found=("$REPO"/dist/accel-agent_*.deb)
	shopt -u nullglob
	[ ${#found[@]} -eq 1 ] || die "make deb left ${#found[@]} packages in dist/"
	grep -q '^deb: dist/ holds' "$RESULTS/make-deb.log" || stamp "make deb: built ($RESULTS/make-deb.log)"
	DEB=${found[0]}
	local relation name
	while read -r relation; do
		name=${relation%% *}
		name=${name%%:*}
		[ -z "$name" ] || LAB_ROOTFS_PACKAGES+=("$name")
	done < <(dpkg-deb -f "$DEB" Depends Pre-Depends Recommends | sed 's/^[A-Za-z-]*: //' |
		tr ',' '\n' | sed 's/|.*//; s/^ *//; s/ *$//')
	stamp "package $(basename "$DEB"); its dependencies go into the rootfs"
}

# --- the guest's disk (LAB_DISK_MB) ------------------------------------------------------

# make_disk: DISK = a new, empty ext4 image; the guest's overlay writes there, so what it
# writes (the installed package, /etc, the agent's state) survives the guest's reboots
# within this run.  Every run starts from a clean one, as a freshly installed host.
make_disk() {
	ensure_packages e2fsprogs
	DISK=$CACHE/disk-$LAB.img
	rm -f "$DISK"
	truncate -s "${LAB_DISK_MB}M" "$DISK"
	mkfs.ext4 -q -F -L lab-upper "$DISK" || die "mkfs.ext4 of $DISK failed"
}

# --- initramfs ----------------------------------------------------------------------

# build_initrd KDIR OUT: busybox + the ordered modules + init.sh as /init.
build_initrd() {
	local kdir=$1 out=$2 tree m
	ensure_packages cpio
	tree=$(mktemp -d "$CACHE/initramfs.XXXXXX")
	mkdir -p "$tree"/{bin,lib/modules,proc,sys,dev,mnt/host}
	cp "$kdir/busybox" "$tree/bin/busybox"
	cp "$kdir/9p.order" "$kdir/overlay.order" "$tree/lib/modules/"
	# init.sh loads the lab's modules from mdev.order
	cp "$kdir/$LAB.order" "$tree/lib/modules/mdev.order"
	# shellcheck disable=SC2013 # the order files are one line of words
	for m in $(cat "$kdir/$LAB.order" "$kdir/9p.order" "$kdir/overlay.order"); do
		cp "$kdir/ko/$m.ko" "$tree/lib/modules/"
	done
	install -m 0755 "$HERE/init.sh" "$tree/init"
	(cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1) >"$out.tmp"
	mv "$out.tmp" "$out"
	rm -rf "$tree"
}

# --- boot -----------------------------------------------------------------------------

# boot: one run of the guest; QRC = QEMU's exit status (124/137: timeout).
boot() {
	local virtfs=() machine=()
	if [ "$LAB_DISK_MB" -gt 0 ]; then
		machine=(-drive "file=$DISK,if=virtio,format=raw,cache=unsafe")
	fi
	# A guest that reboots on purpose (LAB_GUEST_REBOOTS) boots the same kernel again;
	# init.sh counts the boots on the disk and stops a reboot loop (a panic reboots too).
	[ "$LAB_GUEST_REBOOTS" -gt 0 ] || machine+=(-no-reboot)
	if [ "$LAB_ROOT" = rootfs ]; then
		virtfs=(
			-virtfs "local,path=$ROOTFS,mount_tag=rootfs,security_model=none,readonly=on,multidevs=remap"
			-virtfs "local,path=$REPO,mount_tag=repo,security_model=none,readonly=on,multidevs=remap"
		)
	else
		virtfs=(-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap)
	fi
	rm -f "$RESULTS"/{realkernel.junit.xml,console.log,dmesg.log,guest-rc,guest-error,qemu.pid}
	rm -rf "$RESULTS/logs"
	stamp "booting $ABI under QEMU (TCG, ${LAB_MEMORY_MB} MiB), timeout ${TIMEOUT}s"
	# TCG: /dev/kvm on this kind of machine cannot run an unmodified kernel
	# (docs/design.md §12), and the guest's work is small.  vmlinux boots through PVH (no firmware).
	# QEMU does not exit on some errors (the VM just pauses): always under timeout.
	timeout --kill-after=10 "$TIMEOUT" "${QEMU[@]}" \
		-accel tcg -cpu max -smp 2 -m "$LAB_MEMORY_MB" \
		-nodefaults -no-user-config -display none -monitor none "${machine[@]}" \
		-serial stdio -pidfile "$QEMU_PID_FILE" \
		-kernel "$KDIR/vmlinux" -initrd "$INITRD" -append "$APPEND" \
		"${virtfs[@]}" \
		-virtfs "local,path=$RESULTS,mount_tag=results,security_model=none" \
		"${LAB_QEMU_ARGS[@]}" \
		</dev/null >"$RESULTS/console.log" 2>&1 &
	QPID=$!
	QRC=0
	wait "$QPID" || QRC=$?
	QPID=
	stamp "guest exited"
}

# A crash of the lab itself, not of what runs in it: the outer QEMU died of a signal (an
# assertion aborts it) before the guest reported an exit status, or the guest's kernel
# panicked before the lab's init printed its first line ("@@ INIT"), so before anything of
# ours ran.  Seen once in CI: Debian's 6.12 kernel under 2-vCPU TCG, an "Oops: int3" in an
# initcall (a text-patching breakpoint the other vCPU hit), "Kernel panic" 3 s into the boot.
# Never a test failure: a guest that ran its command has written guest-rc, and a panic
# after init started (a test's doing) is not retried.
lab_crashed() {
	[ ! -s "$RESULTS/guest-rc" ] || return 1
	[ "$QRC" != 124 ] && [ "$QRC" != 137 ] || return 1
	if grep -q 'Kernel panic' "$RESULTS/console.log" && ! grep -q '^@@ INIT' "$RESULTS/console.log"; then
		return 0
	fi
	[ "$QRC" -gt 128 ] || grep -q '^qemu-system-x86_64: .*Assertion' "$RESULTS/console.log"
}

# --- main -----------------------------------------------------------------------------

mkdir -p "$CACHE" 2>/dev/null || cannot "cannot create the cache directory $CACHE"
[ -w "$CACHE" ] || cannot "cache directory $CACHE is not writable (set ACCEL_REALKERNEL_CACHE)"
# One lab at a time per cache (two checkouts or CI jobs on one machine).
exec 9>"$CACHE/.lock"
flock -w 900 9 || die "timed out waiting for the lock on $CACHE"

QEMU_PID_FILE='' QPID=''
BUILD_DIR=''
ROOTFS=''
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
	if [ -n "$ROOTFS" ]; then rm -rf "$ROOTFS"/tmp/accel-agent-src "$ROOTFS"/tmp/lab-*; fi
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
QEMU=("$(command -v qemu-system-x86_64)") || cannot "qemu-system-x86_64 not found after installing it"
ensure_kernel

lab_module_order >"$KDIR/$LAB.order.new" || die "module order ($LAB: ${LAB_MODULES[*]})"
mv "$KDIR/$LAB.order.new" "$KDIR/$LAB.order"
INITRD=$KDIR/initrd-$LAB-$(cat "$HERE/init.sh" "$KDIR/$LAB.order" "$KDIR/9p.order" "$KDIR/overlay.order" |
	sha256sum | cut -c1-12).img
if [ ! -f "$INITRD" ]; then
	rm -f "$KDIR"/initrd-"$LAB"-*.img
	build_initrd "$KDIR" "$INITRD"
	stamp "initrd built ($(du -h "$INITRD" | cut -f1))"
fi

mkdir -p "$RESULTS"
# Nothing of an earlier run may pass for this one's (run.sh reads the junit file).
rm -f "$RESULTS"/{realkernel.junit.xml,console.log,dmesg.log,guest-rc,guest-error}
[ "$LAB_DEB" != 1 ] || ensure_deb
if [ "$LAB_ROOT" = rootfs ]; then
	ensure_rootfs
	if [ -n "$LAB_VENV" ]; then
		ensure_venv
		install_agent
	fi
fi
# outer_qemu_rootfs LAB: the rootfs of lab LAB (its profile's suite and packages: the same
# cached tree that lab uses, built on first use), printed.  In a subshell, so that this
# lab's variables stay as they are.
outer_qemu_rootfs() {
	(
		# shellcheck source=labs/trixie.sh
		. "$HERE/labs/$1.sh"
		[ "$LAB_ROOT" = rootfs ] || die "LAB_OUTER_QEMU=$1: lab $1 has no rootfs"
		ensure_rootfs >&2
		echo "$ROOTFS"
	)
}
OUTER_ROOTFS=
case "${LAB_OUTER_QEMU:-host}" in
host) ;;
rootfs)
	[ "$LAB_ROOT" = rootfs ] || die "LAB_OUTER_QEMU=rootfs needs LAB_ROOT=rootfs"
	OUTER_ROOTFS=$ROOTFS
	;;
*)
	[[ $LAB_OUTER_QEMU =~ ^[a-z0-9-]+$ ]] && [ -f "$HERE/labs/$LAB_OUTER_QEMU.sh" ] ||
		die "LAB_OUTER_QEMU=$LAB_OUTER_QEMU: neither host, rootfs nor a lab profile"
	OUTER_ROOTFS=$(outer_qemu_rootfs "$LAB_OUTER_QEMU")
	stamp "outer QEMU: lab $LAB_OUTER_QEMU's rootfs, $OUTER_ROOTFS"
	;;
esac
if [ -n "$OUTER_ROOTFS" ]; then
	[ -x "$OUTER_ROOTFS/usr/bin/qemu-system-x86_64" ] || die "no qemu-system-x86_64 in $OUTER_ROOTFS"
	# The rootfs's QEMU (a device the host's lacks: igb is new in QEMU 8.0) with the
	# rootfs's /usr bind-mounted over /usr in a mount namespace of its own (host and
	# rootfs are both merged-/usr): every host path stays valid, nothing is chrooted,
	# and the exec chain keeps QEMU's pid and name for the clean-up.
	# shellcheck disable=SC2016 # $0 and $@ are for the inner shell
	QEMU=(unshare -m --propagation private sh -c \
		'mount --bind "$0/usr" /usr && exec /usr/bin/qemu-system-x86_64 "$@"' "$OUTER_ROOTFS")
fi
[ "$LAB_DISK_MB" -gt 0 ] && make_disk

# The guest's command script goes into the results share (the guest sees the same path).
rm -f "$RESULTS/guest-cmd.sh"
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
if [ $# -eq 0 ]; then
	# shellcheck disable=SC2206 # word splitting of the extra arguments is intended
	extra=(${ACCEL_REALKERNEL_PYTEST_ARGS:-})
	if [ -n "$LAB_GUEST_SCRIPT" ]; then
		# The script runs the lab's pytest itself (e.g. once per boot of the guest).
		set -- bash "$LAB_GUEST_SCRIPT" "${extra[@]}"
	else
		set -- env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "${LAB_VENV:-/usr}/bin/python3" -m pytest \
			"${LAB_TESTS[@]}" -p no:cacheprovider -q -rfEs --color=no \
			--junitxml="$RESULTS/realkernel.junit.xml" "${extra[@]}"
	fi
fi
{
	echo '#!/bin/bash'
	echo "# written by tests/realkernel/lab.sh; runs in the guest of lab $LAB, chrooted into its root"
	printf 'cd %q || exit 97\n' "$REPO"
	# shellcheck disable=SC2016 # $PATH is for the guest's shell
	[ -z "$LAB_VENV" ] || printf 'export PATH=%q:"$PATH"\n' "$LAB_VENV/bin"
	[ "$LAB_DEB" != 1 ] || printf 'export LAB_DEB_FILE=%q\n' "$DEB"
	printf 'exec'
	printf ' %q' "$@"
	echo
} >"$RESULTS/guest-cmd.sh"

QEMU_PID_FILE=$RESULTS/qemu.pid
APPEND="console=ttyS0 panic=-1 quiet lab_name=$LAB lab_root=$LAB_ROOT lab_out=$RESULTS"
APPEND="$APPEND lab_cmd=$RESULTS/guest-cmd.sh lab_repo=$REPO lab_init=$LAB_INIT"
APPEND="$APPEND lab_disk=$((LAB_DISK_MB > 0)) lab_boots=$((LAB_GUEST_REBOOTS + 1)) $LAB_APPEND"
attempt=1
while :; do
	boot
	lab_crashed || break
	cp "$RESULTS/console.log" "$RESULTS/console-crash-$attempt.log"
	crash=$(grep -m1 -e '^qemu-system-x86_64: ' -e 'Kernel panic' "$RESULTS/console.log" ||
		echo "QEMU exit status $QRC")
	[ "$attempt" -lt 2 ] || die "the lab's QEMU or the guest's boot crashed twice ($crash); console: $RESULTS/console.log"
	stamp "the lab's QEMU or the guest's boot crashed before any test ran ($crash): not a test failure;" \
		"booting once more (console kept in console-crash-$attempt.log)"
	# a guest that writes to its disk starts again from a fresh one
	[ "$LAB_DISK_MB" -le 0 ] || make_disk
	attempt=$((attempt + 1))
done

if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
	die "the guest did not finish within ${TIMEOUT}s (console: $RESULTS/console.log)"
fi
if [ ! -s "$RESULTS/guest-rc" ]; then
	die "the guest reported no exit status (QEMU rc=$QRC; console: $RESULTS/console.log)"
fi
if [ -s "$RESULTS/guest-error" ]; then
	die "in the guest: $(cat "$RESULTS/guest-error") (console: $RESULTS/console.log)"
fi
rc=$(cat "$RESULTS/guest-rc")
stamp "guest command exit status $rc"
exit "$rc"
