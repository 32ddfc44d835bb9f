# shellcheck shell=bash
# Host side: fetch Debian's kernel package and unpack it into a cache folder
# keyed by package version. Never installs anything on the host.
#
#   vm_kernel_fetch   sets VM_KVER (e.g. 6.1.0-57-amd64), VM_KDIR (unpacked
#                     root: boot/vmlinuz-*, lib/modules/$VM_KVER) and
#                     VM_KERNEL_PKG; returns 77 when no kernel can be had.
#
# The cache keeps only the modules the guests need (and their dependencies),
# so an entry is ~15 MB instead of ~400 MB; an entry is named by package,
# version and a hash of the module list. Concurrent runs are serialised
# with flock on the cache folder.

# Modules the guests load; --show-depends adds what they need.
VM_MODULES=(
  virtio_pci virtio_blk
  ext4 crc32c_generic
  cxl_acpi cxl_pci cxl_mem cxl_pmem
  libnvdimm nd_pmem nd_btt nfit
  device_dax dax_pmem dax_hmem kmem
)

vm_cache_dir() {
  echo "${CXLPOOL_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cxlpool-vm}"
}

# apt-get/apt-cache ("get" or "cache") with the host's sources, or, when
# $CXLPOOL_VM_KERNEL_SUITE names a suite (bookworm-backports: a 6.12 kernel
# with DAMON), with a private source list and package lists kept in the
# cache folder. The host's apt state is never touched.
VM_APT_OPTS=()
vm_apt_setup() {  # cache
  local suite=${CXLPOOL_VM_KERNEL_SUITE:-} dir
  VM_APT_OPTS=()
  [[ -n $suite ]] || return 0
  dir=$1/apt-$suite
  mkdir -p "$dir/lists/partial" "$dir/archives/partial" || return 1
  echo "deb http://deb.debian.org/debian $suite main" >"$dir/sources.list"
  VM_APT_OPTS=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir" -o "Dir::Cache::archives=$dir/archives")
  apt-get "${VM_APT_OPTS[@]}" update -q >"$dir/update.log" 2>&1 ||
    vm_log "apt-get update for $suite failed (see $dir/update.log); trying the lists already there"
}
vm_apt() {  # get|cache args...
  local tool=apt-$1
  shift
  "$tool" "${VM_APT_OPTS[@]}" "$@"
}

# The versioned kernel package that linux-image-amd64 depends on, or the one
# named by $CXLPOOL_VM_KERNEL_PKG.
vm_kernel_pkg() {
  if [[ -n ${CXLPOOL_VM_KERNEL_PKG:-} ]]; then
    echo "$CXLPOOL_VM_KERNEL_PKG"
    return
  fi
  vm_apt cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

# Newest complete cache entry, for when apt cannot answer (offline).
vm_kernel_newest_cached() {
  local cache=$1
  ls -1d "$cache"/linux-image-*/ 2>/dev/null | sort -V | while read -r d; do
    [[ -f $d/.complete ]] &&
      diff -q <(printf '%s\n' "${VM_MODULES[@]}") "$d/.modules" >/dev/null 2>&1 && echo "${d%/}"
  done | tail -n1
}

vm_kernel_unpack() {  # pkg version dest
  local pkg=$1 ver=$2 dest=$3 kver=${1#linux-image-}
  local tmp
  tmp=$(mktemp -d "$(dirname "$dest")/.fetch.XXXXXX") || return 1
  # apt-get download writes into the current directory. As root it warns that
  # the _apt sandbox user cannot write there; that is harmless.
  if ! (cd "$tmp" && vm_apt get download -q "${pkg}=${ver}" >"$tmp/apt.log" 2>&1); then
    vm_log "apt-get download $pkg=$ver failed:"
    sed 's/^/    /' "$tmp/apt.log" >&2
    rm -rf "$tmp"
    return 1
  fi
  mkdir -p "$tmp/full" "$tmp/root/boot"
  dpkg-deb -x "$tmp"/*.deb "$tmp/full" || { rm -rf "$tmp"; return 1; }
  cp "$tmp/full/boot/vmlinuz-$kver" "$tmp/full/boot/config-$kver" "$tmp/root/boot/"
  # depmod the full tree once so --show-depends can resolve, then keep only the
  # closure of VM_MODULES (plus the builtin list modprobe needs).
  local full_mods=$tmp/full/lib/modules/$kver keep_mods=$tmp/root/lib/modules/$kver
  depmod -b "$tmp/full" "$kver" || { rm -rf "$tmp"; return 1; }
  mkdir -p "$keep_mods"
  cp "$full_mods"/modules.builtin* "$full_mods"/modules.order "$keep_mods/"
  local m path
  for m in "${VM_MODULES[@]}"; do
    # -C /dev/null: ndctl's modprobe.d "install" rules would otherwise replace
    # the insmod lines we parse.
    modprobe -C /dev/null --show-depends -d "$tmp/full" -S "$kver" "$m" 2>/dev/null |
      awk '$1 == "insmod" { print $2 }'
  done | sort -u | while read -r path; do
    mkdir -p "$keep_mods/$(dirname "${path#"$full_mods"/}")"
    cp "$path" "$keep_mods/${path#"$full_mods"/}"
  done
  # Newer kernels ship modules as .ko.xz; the guest's kmod may lack xz, so
  # the kept ones are stored plain.
  if find "$keep_mods" -name '*.ko.xz' | grep -q .; then
    command -v xz >/dev/null || { vm_log "xz missing (xz-utils) for $pkg's modules"; rm -rf "$tmp"; return 1; }
    find "$keep_mods" -name '*.ko.xz' -exec xz -d {} + || { rm -rf "$tmp"; return 1; }
  fi
  depmod -b "$tmp/root" "$kver" || { rm -rf "$tmp"; return 1; }
  printf '%s\n' "${VM_MODULES[@]}" >"$tmp/root/.modules"
  rm -rf "$tmp/full" "$tmp"/*.deb "$tmp/apt.log"
  touch "$tmp/root/.complete"
  rm -rf "$dest"
  mv "$tmp/root" "$dest"
  rmdir "$tmp"
}

vm_kernel_fetch() {
  local cache pkg ver dest
  cache=$(vm_cache_dir)
  mkdir -p "$cache" || { vm_log "cannot create cache $cache"; return 77; }
  exec {vm_lock_fd}>"$cache/.lock"
  flock "$vm_lock_fd"
  vm_apt_setup "$cache" || { flock -u "$vm_lock_fd"; vm_log "cannot create apt state in $cache"; return 77; }
  pkg=$(vm_kernel_pkg)
  ver=""
  if [[ -n $pkg ]]; then
    ver=$(vm_apt cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Version:/ { print $2; exit }')
  fi
  if [[ -n $pkg && -n $ver ]]; then
    # Keyed by the module list too: runs that want other modules (another
    # branch, the systemd guest's ext4) keep their own entry instead of
    # replacing one another's.
    dest="$cache/${pkg}_${ver}_m$(printf '%s\n' "${VM_MODULES[@]}" | sha256sum | cut -c1-8)"
    if [[ ! -f $dest/.complete ]] ||
      ! diff -q <(printf '%s\n' "${VM_MODULES[@]}") "$dest/.modules" >/dev/null 2>&1; then
      vm_log "fetching $pkg $ver into $dest"
      if ! vm_kernel_unpack "$pkg" "$ver" "$dest"; then
        dest=""
      fi
    fi
  fi
  if [[ -z ${dest:-} || ! -f $dest/.complete ]]; then
    dest=$(vm_kernel_newest_cached "$cache")
    [[ -n $dest ]] && vm_log "apt could not provide the kernel; using cached $dest"
  fi
  flock -u "$vm_lock_fd"
  if [[ -z $dest ]]; then
    vm_log "SKIP: no Debian kernel package available (apt-get download failed, cache empty)"
    return 77
  fi
  VM_KDIR=$dest
  VM_KERNEL_PKG=$(basename "$dest")
  VM_KVER=$(basename "$(ls -1d "$dest"/lib/modules/*/ | head -n1)")
  VM_VMLINUZ="$dest/boot/vmlinuz-$VM_KVER"
  [[ -f $VM_VMLINUZ ]] || { vm_log "SKIP: $VM_VMLINUZ missing"; return 77; }
  return 0
}
