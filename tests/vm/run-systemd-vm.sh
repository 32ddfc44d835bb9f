#!/usr/bin/env bash
# VM tier, systemd guest: boots Debian's kernel under QEMU (TCG) with Debian's
# systemd as PID 1 on a Debian 12 root made with debootstrap, installs the
# project's packages with dpkg -i and checks the service as an operator would
# meet it (tests/vm/guest/systemd-checks.sh; docs/testing.md):
#   dpkg -i and what its scripts did, socket activation and systemctl start,
#   READY=1 and the watchdog, systemctl restart with a client holding a lease
#   (mapping intact, the lease reclaimed, the fd store used), journalctl -p
#   warning, systemctl reload applying a quota change, the admin group as
#   shipped, the metrics socket, no restart loop on a configuration error,
#   and dpkg --purge.
#
# usage: tests/vm/run-systemd-vm.sh [options]
#   --build-dir D   project build folder (default: $CXLPOOL_BINARY_DIR, else
#                   <source>/build): the VM client comes from there
#   --packages D    the .deb files (default: <build-dir>/packages, as the
#                   package_build test leaves them)
#   --out D         results folder (default: <build-dir>/vm-results/systemd)
#   --timeout S     host-side limit in seconds (default 600)
#   --shell         after the checks, a root shell on the console (no password)
#   -v              stream the guest console while it runs
# environment:
#   CXLPOOL_VM_CACHE    kernel and guest image cache (default ~/.cache/cxlpool-vm)
#   CXLPOOL_VM_MIRROR   Debian mirror for debootstrap (default: the host's)
#   CXLPOOL_VM_SKIP=1   skip (exit 77)
# exit: 0 every check passed; 1 a check, the boot or the guest failed;
#       77 it cannot run here (the reason is printed): not root, no qemu,
#       no debootstrap or mke2fs, no packages, no kernel, no guest image.
#
# Host side effects: files in the cache and the results folder only; no
# mount, no loop device. debootstrap runs once per guest package list (the
# root tarball is cached); each run unpacks it, adds the packages and the
# checks, and writes an ext4 image with mke2fs -d.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_SRC=$(cd "$HERE/../.." && pwd)
vm_log() { echo "vm: $*" >&2; }
# shellcheck source=lib/kernel.sh
source "$HERE/lib/kernel.sh"
# shellcheck source=lib/initramfs.sh
source "$HERE/lib/initramfs.sh"
# shellcheck source=lib/guest-image.sh
source "$HERE/lib/guest-image.sh"
# shellcheck source=lib/guest-run.sh
source "$HERE/lib/guest-run.sh"

VM_BUILD=${CXLPOOL_BINARY_DIR:-$VM_SRC/build}
packages="" out="" timeout_s=600 shell=0 verbose=0
while (($#)); do
  case $1 in
    --build-dir) VM_BUILD=$2; shift ;;
    --packages) packages=$2; shift ;;
    --out) out=$2; shift ;;
    --timeout) timeout_s=$2; shift ;;
    --shell) shell=1 ;;
    -v) verbose=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) vm_log "unknown argument $1 (--help)"; exit 2 ;;
  esac
  shift
done
[[ ${CXLPOOL_VM_SKIP:-0} == 1 ]] && { vm_log "SKIP: CXLPOOL_VM_SKIP=1"; exit 77; }
VM_BUILD=$(cd "$VM_BUILD" 2>/dev/null && pwd) || { vm_log "no build folder $VM_BUILD"; exit 2; }
packages=${packages:-$VM_BUILD/packages}
out=${out:-$VM_BUILD/vm-results/systemd}
QEMU=$(command -v qemu-system-x86_64) ||
  { vm_log "SKIP: qemu-system-x86_64 missing (scripts/install-deps.sh --vm)"; exit 77; }
for tool in apt-get dpkg-deb depmod modprobe cpio flock timeout tar; do
  command -v "$tool" >/dev/null || { vm_log "SKIP: $tool missing"; exit 77; }
done
command -v mke2fs >/dev/null || [[ -x /sbin/mke2fs ]] ||
  { vm_log "SKIP: mke2fs missing (e2fsprogs)"; exit 77; }
[[ $(id -u) -eq 0 ]] || { vm_log "SKIP: needs root (debootstrap, root-owned files in the image)"; exit 77; }
debs=()
for p in cxlpool libcxlpool0 python3-cxlpool; do
  f=$(ls "$packages"/${p}_*.deb 2>/dev/null | head -n1)
  [[ -n $f ]] || { vm_log "SKIP: no ${p}_*.deb in $packages (scripts/build-debs.sh --out $packages)"; exit 77; }
  debs+=("$f")
done
client=$VM_BUILD/tests/vm/clients/cxlpool-vm-client
[[ -x $client ]] || { vm_log "SKIP: $client not built"; exit 77; }

t_start=$SECONDS
vm_kernel_fetch || exit $?
vm_log "kernel $VM_KERNEL_PKG ($VM_KVER)"

# The packages' run-time dependencies (names only) go into the cached root,
# so that `dpkg -i` in the guest finds them, as `apt install` would have.
deps=()
for f in "${debs[@]}"; do
  while read -r d; do
    [[ -n $d && $d != libcxlpool0 ]] && deps+=("$d")
  done < <(dpkg-deb -f "$f" Depends | tr ',' '\n' | sed -E 's/\|.*//; s/\(.*\)//; s/:any//; s/[[:space:]]//g')
done
vm_guest_base "${deps[@]}" jq passwd || exit $?
t_base=$SECONDS

rm -rf "$out"
mkdir -p "$out/work" "$out/out"
work=$out/work
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
vm_guest_unpack "$VM_GUEST_TAR" "$rootfs" || { vm_log "cannot unpack $VM_GUEST_TAR"; exit 1; }
mkdir -p "$rootfs/vm/debs" "$rootfs/opt/cxlpool/bin" "$rootfs/lib/modules"
cp "${debs[@]}" "$rootfs/vm/debs/"
cp "$HERE/guest/lib.sh" "$HERE/guest/systemd-checks.sh" "$rootfs/vm/"
# The client links libcxlpool.so.0, which the package installs; strip its
# build-tree RUNPATH's effect by keeping only the binary.
strip --strip-debug -o "$rootfs/opt/cxlpool/bin/cxlpool-vm-client" "$client" 2>/dev/null ||
  cp "$client" "$rootfs/opt/cxlpool/bin/"
cp -a "$VM_KDIR/lib/modules/$VM_KVER" "$rootfs/lib/modules/"
cat >"$rootfs/etc/systemd/system/cxlpool-vm-checks.service" <<'UNIT'
[Unit]
Description=cxlpool systemd VM checks
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/bin/bash /vm/systemd-checks.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
TimeoutStartSec=infinity
UNIT
((shell)) && touch "$rootfs/vm/shell"
vm_guest_mkfs "$rootfs" "$work/root.img" 1536M || { vm_log "mke2fs -d failed"; exit 1; }
rm -rf "$rootfs"

# A small initramfs: load virtio and ext4, mount the disk, switch to systemd.
ird=$work/initramfs
mkdir -p "$ird"/{bin,sbin,dev,proc,sys,newroot,lib/modules}
bb=$(command -v busybox) || { vm_log "SKIP: busybox missing"; exit 77; }
vm_copy_elf "$bb" /bin/busybox "$ird"
for a in sh mount umount switch_root sleep cat echo mkdir; do ln -sf busybox "$ird/bin/$a"; done
vm_copy_elf "$(command -v kmod)" /sbin/kmod "$ird"
ln -sf kmod "$ird/sbin/modprobe"
cp -a "$VM_KDIR/lib/modules/$VM_KVER" "$ird/lib/modules/"
cat >"$ird/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in virtio_pci virtio_blk crc32c_generic ext4; do /sbin/modprobe "$m"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
mount -t ext4 -o rw,noatime /dev/vda /newroot || { echo "CXLPOOL-VM-NOTE cannot mount /dev/vda"; exec sh; }
umount /proc /sys
mount --move /dev /newroot/dev 2>/dev/null || umount /dev
exec switch_root /newroot /lib/systemd/systemd
INIT
chmod 0755 "$ird/init"
(cd "$ird" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$work/initrd.cpio"
truncate -s 64M "$work/out.img"
t_prep=$SECONDS

append="console=ttyS0 panic=-1 loglevel=4 systemd.show_status=auto systemd.wants=cxlpool-vm-checks.service"
qemu=("$QEMU" -accel tcg -nodefaults -no-user-config -display none -no-reboot
  -machine q35 -smp 2 -m 1536M
  -kernel "$VM_VMLINUZ" -initrd "$work/initrd.cpio" -append "$append"
  -drive "file=$work/root.img,format=raw,if=none,id=root,cache=unsafe"
  -device virtio-blk-pci,drive=root,bus=pcie.0
  -drive "file=$work/out.img,format=raw,if=none,id=outdisk,cache=unsafe"
  -device virtio-blk-pci,drive=outdisk,bus=pcie.0)
t0=$SECONDS
vm_qemu_run "$out" "$timeout_s" "$shell" "$verbose" "${qemu[@]}"
t_vm=$((SECONDS - t0))
tar -xf "$work/out.img" -C "$out/out" 2>/dev/null || vm_log "no guest output on the result disk"
vm_verdict systemd "$out" "$timeout_s" "$shell"
status=$VM_STATUS why=$VM_WHY result=$VM_RESULT
echo "vm: systemd $status ${result#*status=* } guest=${t_vm}s (boot, dpkg -i, checks);" \
  "prepare=$((t_prep - t_start))s (kernel and cached guest root $((t_base - t_start))s," \
  "disk image $((t_prep - t_base))s)${why:+ ($why)}" | tee "$out/summary"
[[ $status == pass ]]
