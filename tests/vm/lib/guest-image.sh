# shellcheck shell=bash
# Host side: the systemd guest's root file system, from Debian's packages.
#
#   vm_guest_base PACKAGES...
#     sets VM_GUEST_TAR to a tarball of a Debian 12 minimal root
#     (debootstrap --variant=minbase) with systemd as init and PACKAGES
#     installed, made once and cached in $(vm_cache_dir) under a key of the
#     suite, mirror and package list. Returns 77 (with the reason logged)
#     when it cannot be made here: not root (debootstrap and the root-owned
#     files of the image need it), no debootstrap, no network and no cache.
#
#   vm_guest_image TAR ROOTFS IMAGE SIZE
#     unpacks TAR into ROOTFS (the caller adds its files) and, on a second
#     call with ROOTFS ready, vm_guest_mkfs ROOTFS IMAGE SIZE writes an ext4
#     image of it with mke2fs -d (no loop device, no mount).
#
# The root is prepared to boot quickly under TCG without udev or D-Bus: a
# fixed machine id (no first-boot setup), units that wait for devices or D-Bus
# masked (gettys, logind), periodic timers masked, the journal in memory.

VM_GUEST_SUITE=${CXLPOOL_VM_SUITE:-bookworm}
# Bump when the preparation below changes: it is part of the cache key.
VM_GUEST_RECIPE=3

vm_guest_mirror() {
  if [[ -n ${CXLPOOL_VM_MIRROR:-} ]]; then
    echo "$CXLPOOL_VM_MIRROR"
    return
  fi
  # The host's own Debian mirror, else deb.debian.org.
  local m
  m=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list.d/*.list 2>/dev/null |
    grep -oE 'https?://[^ ]*/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ')
  echo "${m:-http://deb.debian.org/debian}"
}

vm_guest_base() {
  local cache mirror key pkgs tar tmp
  cache=$(vm_cache_dir)
  mirror=$(vm_guest_mirror)
  pkgs=$(printf '%s\n' systemd systemd-sysv "$@" | sort -u | tr '\n' ',' | sed 's/,$//')
  key=$(printf '%s %s %s %s\n' "$VM_GUEST_SUITE" "$mirror" "$pkgs" "$VM_GUEST_RECIPE" |
    sha256sum | cut -c1-16)
  tar=$cache/systemd-guest-$VM_GUEST_SUITE-$key.tar
  VM_GUEST_TAR=$tar
  if [[ -f $tar ]]; then
    vm_log "guest image: cached $tar"
    return 0
  fi
  if [[ $(id -u) -ne 0 ]]; then
    vm_log "SKIP: building the guest image needs root (debootstrap; root-owned files)"
    return 77
  fi
  command -v debootstrap >/dev/null ||
    { vm_log "SKIP: debootstrap missing (scripts/install-deps.sh --vm)"; return 77; }
  mkdir -p "$cache"
  exec {vm_guest_lock}>"$cache/.guest.lock"
  flock "$vm_guest_lock"
  if [[ -f $tar ]]; then
    flock -u "$vm_guest_lock"
    return 0
  fi
  tmp=$(mktemp -d "$cache/.guest.XXXXXX")
  vm_log "guest image: debootstrap $VM_GUEST_SUITE (minbase + $pkgs) from $mirror"
  local t0=$SECONDS
  if ! debootstrap --variant=minbase --include="$pkgs" "$VM_GUEST_SUITE" "$tmp/root" "$mirror" \
    >"$tmp/debootstrap.log" 2>&1; then
    vm_log "debootstrap failed (last lines of $tmp/debootstrap.log):"
    tail -n 15 "$tmp/debootstrap.log" | sed 's/^/    /' >&2
    # Leave no half-made root behind; a debootstrap killed mid-way may have
    # left its /proc mounted.
    umount -R "$tmp/root/proc" "$tmp/root/sys" 2>/dev/null
    rm -rf "$tmp"
    flock -u "$vm_guest_lock"
    vm_log "SKIP: no guest image (offline? set CXLPOOL_VM_MIRROR)"
    return 77
  fi
  vm_guest_prepare "$tmp/root"
  tar --numeric-owner --xattrs -C "$tmp/root" -cf "$tmp/guest.tar" .
  mv "$tmp/guest.tar" "$tar"
  rm -rf "$tmp"
  flock -u "$vm_guest_lock"
  vm_log "guest image: made in $((SECONDS - t0)) s, $(($(stat -c %s "$tar") / 1048576)) MiB: $tar"
}

vm_guest_prepare() {
  local r=$1 u
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/*_Packages
  echo cxlpool-systemd-vm >"$r/etc/hostname"
  # A fixed machine id: no first boot (systemd-firstboot would prompt).
  echo 5e1f1c0a7c2d4e6f8a9b0c1d2e3f4a5b >"$r/etc/machine-id"
  # The initramfs mounts /dev/vda read-write; an fstab line would make
  # systemd wait for a device unit that, without udev, never appears.
  echo '# empty: the initramfs mounts the root (/dev/vda) read-write' >"$r/etc/fstab"
  mkdir -p "$r/etc/systemd/system" "$r/etc/systemd/journald.conf.d"
  # No udev and no D-Bus in the guest: units that wait for a device or for
  # D-Bus would only time out. Periodic jobs are noise in a test.
  for u in getty@tty1.service serial-getty@ttyS0.service systemd-logind.service \
    apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
    fstrim.timer systemd-tmpfiles-clean.timer systemd-timesyncd.service \
    systemd-networkd-wait-online.service; do
    ln -sf /dev/null "$r/etc/systemd/system/$u"
  done
  printf '[Journal]\nStorage=volatile\nForwardToConsole=no\n' \
    >"$r/etc/systemd/journald.conf.d/cxlpool-vm.conf"
  # root without a password on the console (the --shell option).
  sed -i 's/^root:[^:]*:/root::/' "$r/etc/shadow"
}

vm_guest_unpack() {  # tar rootfs
  rm -rf "$2"
  mkdir -p "$2"
  tar --numeric-owner --xattrs -C "$2" -xf "$1"
}

vm_guest_mkfs() {  # rootfs image size
  rm -f "$2"
  truncate -s "$3" "$2"
  local mkfs
  mkfs=$(command -v mke2fs || echo /sbin/mke2fs)
  "$mkfs" -q -F -t ext4 -L cxlpool-root -E root_owner=0:0 -d "$1" "$2" >/dev/null
}
