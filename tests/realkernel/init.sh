#!/bin/busybox sh
# /init of the real-kernel lab's initramfs (busybox-static + a few .ko files).
#
# 1. load the virtio/9p chain and mount the guest's root: with lab_root=host the
#    host's / (read-only); with lab_root=rootfs the lab's rootfs (read-only 9p under
#    a tmpfs overlay, so the guest can write anywhere and the cache stays as it is)
#    with the checkout (read-only) at its host path; then the results share
#    (read-write, at the same path as on the host);
# 2. load vfio + mdev + mtty in dependency order (lib/modules/*.order, computed by
#    labtool.py modorder) and check that the mtty parent appeared;
# 3. bring up the loopback interface (a live migration goes over 127.0.0.1), then
#    run lab_cmd=SCRIPT (written by lab.sh into the results share) with bash,
#    chrooted into that root, with the guest's own /proc, /sys, /dev and tmpfs over
#    /tmp, /var/tmp, /run, /dev/shm;
# 4. write the exit status to <results>/guest-rc and power off (QEMU exits:
#    -no-reboot; a panic exits too: panic=-1).
#
# lab_init=systemd (a lab whose PID 1 must be systemd): steps 1-2 the same, then
# systemd is exec'd as PID 1 in that root (switch_root) and runs lab_cmd from a unit,
# lab-guest.service, written here; that unit writes guest-rc and powers off, or reboots
# the guest when lab_cmd exits with 200 (the next boot runs lab_cmd again).
# lab_disk=1: the rootfs overlay's upper layer is the ext4 disk /dev/vda (made by
# lab.sh), not a tmpfs, so what a boot writes is there on the next one; lab_boots=N
# is how many boots a run may take (a reboot loop, e.g. after a panic, ends the lab).
# Lines starting with "@@" on the console are for humans reading console.log.

/bin/busybox --install -s /bin
export PATH=/bin
H=/mnt/host

say() { echo "@@ $* (uptime $(cut -d' ' -f1 /proc/uptime))"; }
finish() {
	# $1 = exit status, $2 = reason when the lab itself failed
	[ -n "$2" ] && say "LAB_ERROR $2"
	if [ -n "$OUT" ] && grep -q " $H$OUT 9p " /proc/mounts; then
		[ -n "$2" ] && echo "$2" >"$H$OUT/guest-error"
		dmesg >"$H$OUT/dmesg.log" 2>&1
		echo "$1" >"$H$OUT/guest-rc"
		umount "$H$OUT"
	fi
	sync
	say "POWEROFF rc=$1"
	poweroff -f
	sleep 60 # poweroff -f does not return; never let PID 1 exit (that panics)
}
load() {
	# shellcheck disable=SC2013 # the order files are one line of words
	for m in $(cat "/lib/modules/$1.order"); do
		[ -d "/sys/module/$m" ] && continue # shared with an earlier chain (virtio)
		insmod "/lib/modules/$m.ko" || return 1
	done
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

OUT='' CMD='' ROOT=host NAME='' INIT=chroot DISK=0 BOOTS=1
# shellcheck disable=SC2013 # the command line is one line of words
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	lab_out=*) OUT=${arg#lab_out=} ;;
	lab_cmd=*) CMD=${arg#lab_cmd=} ;;
	lab_repo=*) REPO=${arg#lab_repo=} ;;
	lab_root=*) ROOT=${arg#lab_root=} ;;
	lab_name=*) NAME=${arg#lab_name=} ;;
	lab_init=*) INIT=${arg#lab_init=} ;;
	lab_disk=*) DISK=${arg#lab_disk=} ;;
	lab_boots=*) BOOTS=${arg#lab_boots=} ;;
	esac
done
say "INIT kernel $(uname -r) lab ${NAME:-?} root $ROOT"

load 9p || finish 70 "insmod of the 9p chain failed: $(cat /lib/modules/9p.order)"
# The lab's own modules (mdev.order: vfio, mdev, mtty, and a disk's driver chain when the
# lab has one) before any mount: the overlay of lab_disk=1 needs them.
load mdev || finish 70 "insmod of the lab's modules failed: $(cat /lib/modules/mdev.order)"
if [ "$ROOT" = rootfs ]; then
	load overlay || finish 70 "insmod of overlay failed"
	mkdir -p /lower /rw
	mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose rootfs /lower ||
		finish 70 "mounting the lab rootfs over 9p failed"
	if [ "$DISK" = 1 ]; then
		mount -t ext4 /dev/vda /rw || finish 70 "mounting the lab disk /dev/vda failed"
		boot=$(($(cat /rw/boots 2>/dev/null || echo 0) + 1))
		echo "$boot" >/rw/boots
		say "BOOT $boot of at most $BOOTS"
		[ "$boot" -le "$BOOTS" ] || {
			# the results share is not mounted yet: mount it (at $H, still empty) to say why
			mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 results /mnt/host &&
				OUT_EARLY=1
			echo "boot $boot: more boots than the lab's $BOOTS (a reboot loop or a panic)" \
				>/mnt/host/guest-error 2>/dev/null
			[ -z "${OUT_EARLY:-}" ] || { echo 70 >/mnt/host/guest-rc; umount /mnt/host; }
			sync
			say "POWEROFF rc=70"
			poweroff -f
			sleep 60
		}
	else
		mount -t tmpfs -o mode=0755 tmpfs /rw
	fi
	mkdir -p /rw/upper /rw/work
	mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay $H ||
		finish 70 "the overlay over the lab rootfs failed"
else
	mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot $H ||
		finish 70 "mounting the host root over 9p failed"
fi
if [ "$INIT" = chroot ]; then
	mount -t proc proc $H/proc
	mount -t sysfs sysfs $H/sys
	mount -t devtmpfs devtmpfs $H/dev
	mkdir -p $H/dev/shm $H/dev/pts
	mount -t devpts devpts $H/dev/pts
	# what a booted system has beside devtmpfs (udev/systemd make them): mdevctl, which
	# libvirt's node-device driver runs, reads a definition from /dev/stdin
	ln -sfn /proc/self/fd $H/dev/fd
	for fd in 0:stdin 1:stdout 2:stderr; do ln -sfn "/proc/self/fd/${fd%%:*}" "$H/dev/${fd#*:}"; done
fi
if [ "$ROOT" = host ]; then
	# Keep a view of the host root before the tmpfs mounts hide parts of it: a
	# checkout under /tmp (CI clones often live there) must stay visible.
	mkdir -p /hostview
	mount -o bind $H /hostview || finish 70 "bind-mounting the host root view failed"
fi
if [ "$INIT" = chroot ]; then
	for d in tmp var/tmp run dev/shm; do mount -t tmpfs -o mode=1777 tmpfs "$H/$d"; done
fi
if [ "$ROOT" = rootfs ]; then
	mkdir -p "$H$REPO"
	mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose repo "$H$REPO" ||
		finish 70 "mounting the checkout $REPO over 9p failed"
else
	case "$REPO" in
	/tmp/* | /var/tmp/* | /run/* | /dev/shm/*)
		mkdir -p "$H$REPO"
		mount -o bind "/hostview$REPO" "$H$REPO" || finish 70 "bind-mounting the checkout $REPO failed"
		;;
	esac
fi
[ -n "$OUT" ] || finish 70 "no lab_out= on the kernel command line"
mkdir -p "$H$OUT" 2>/dev/null # only possible when it lies on one of the tmpfs above
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 results "$H$OUT" ||
	finish 70 "mounting the results share at $OUT failed"

# A test that reloads mtty (a boot of the mdev stack, tests/realkernel/libvirtdefs/) finds
# the module in the guest's root: the rootfs has no modules of this kernel.
if [ "$ROOT" = rootfs ] && [ -f /lib/modules/mtty.ko ]; then
	mkdir -p $H/lib/modules/lab && cp /lib/modules/mtty.ko $H/lib/modules/lab/
fi
[ -d /sys/class/mdev_bus/mtty ] || finish 70 "mtty loaded but /sys/class/mdev_bus/mtty is missing"
say "MDEV_PARENTS $(ls /sys/class/mdev_bus)"
[ -n "$CMD" ] || finish 70 "no lab_cmd= on the kernel command line"

if [ "$INIT" = systemd ]; then
	[ -x $H/lib/systemd/systemd ] || finish 70 "lab_init=systemd but the root has no /lib/systemd/systemd"
	# lab-guest.service: lab_cmd under systemd, once the system is up; then guest-rc and
	# power off, or reboot when lab_cmd asks for it (exit status 200).
	mkdir -p $H/usr/local/sbin $H/etc/systemd/system/multi-user.target.wants
	cat >$H/usr/local/sbin/lab-guest <<-EOF
		#!/bin/bash
		rc=0
		/bin/bash "$CMD" || rc=\$?
		echo "@@ GUEST_CMD_RC \$rc (uptime \$(cut -d' ' -f1 /proc/uptime))" >/dev/console
		if [ "\$rc" = 200 ]; then
			systemctl reboot
			exit 0
		fi
		dmesg >"$OUT/dmesg.log" 2>&1
		journalctl -b --no-pager >"$OUT/journal.log" 2>&1
		echo "\$rc" >"$OUT/guest-rc"
		sync
		echo "@@ POWEROFF rc=\$rc" >/dev/console
		systemctl poweroff
	EOF
	chmod 0755 $H/usr/local/sbin/lab-guest
	cat >$H/etc/systemd/system/lab-guest.service <<-EOF
		[Unit]
		Description=the real-kernel lab's command ($NAME)
		[Service]
		Type=simple
		ExecStart=/usr/local/sbin/lab-guest
		StandardOutput=journal+console
		StandardError=journal+console
		WorkingDirectory=$REPO
		Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
		Environment=HOME=/root TMPDIR=/tmp LANG=C.UTF-8 TERM=dumb PYTHONDONTWRITEBYTECODE=1
		Environment=PYTHONUNBUFFERED=1 ACCEL_REALKERNEL_GUEST=1 ACCEL_REALKERNEL_LAB=$NAME
		Environment=LAB_OUT=$OUT
		[Install]
		WantedBy=multi-user.target
	EOF
	ln -sf /etc/systemd/system/lab-guest.service \
		$H/etc/systemd/system/multi-user.target.wants/lab-guest.service
	# A root over 9p has nothing for systemd-remount-fs and fsck to do; no login prompt.
	ln -sf /dev/null $H/etc/systemd/system/serial-getty@ttyS0.service
	say "SWITCH_ROOT systemd"
	exec switch_root $H /lib/systemd/systemd
fi

ip link set lo up || finish 70 "cannot bring up the loopback interface"

say "GUEST_CMD_START $CMD"
chroot $H /usr/bin/env -i \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8 TERM=dumb \
	PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
	ACCEL_REALKERNEL_GUEST=1 ACCEL_REALKERNEL_LAB="$NAME" LAB_OUT="$OUT" \
	/bin/bash "$CMD"
rc=$?
say "GUEST_CMD_RC $rc"
finish $rc
