# shellcheck shell=bash
# Host side: build the guest's initramfs (cpio newc, uncompressed: TCG
# decompresses slowly and the image is small).
#
#   vm_build_initramfs STAGING OUT_CPIO
#     needs VM_KDIR/VM_KVER (kernel.sh), VM_SRC (source tree), VM_BUILD
#     (project build folder, may lack binaries). Sets VM_PROJECT_BINS to the
#     names of the project binaries it packed.
#
# Layout inside the guest:
#   /init                  tests/vm/guest/init
#   /vm/*.sh               guest libraries; /vm/topologies/*.sh topologies
#   /bin                   busybox and its applets
#   /sbin                  kmod (modprobe, insmod, lsmod, ...)
#   /usr/bin               cxl ndctl daxctl numactl jq (+ their libraries)
#   /opt/cxlpool/bin       the project's binaries (stripped) + cxlpool-vm-probe
#   /lib/modules/$VM_KVER  the CXL/DAX/NVDIMM/virtio modules, depmod'ed
#
# A caller may add more: VM_EXTRA_TOOLS (host binaries packed into /usr/bin
# with their libraries, e.g. etcdctl) and VM_EXTRA_ROOT (a folder whose
# contents are copied over the root, e.g. /vm/etcd's certificates).

# Host tools the guest needs; all come from Debian packages (install-deps --vm).
VM_GUEST_TOOLS=(/usr/bin/cxl /usr/bin/ndctl /usr/bin/daxctl /usr/bin/numactl /usr/bin/jq)

# Project binaries, relative to the build folder. Missing ones are skipped:
# the guest checks skip what they cannot run and say so.
VM_PROJECT_CANDIDATES=(
  tools/cxlpoolctl/cxlpoolctl tools/cxlpoolctl
  daemon/cxlpoold daemon/cxlpoold/cxlpoold
  tests/vm/cxlpool-vm-probe
  tools/bench/cxlpool-bench
  tests/tiering/tiering_damon_live_test
)
# Any executable in these build folders is packed too (example/test clients).
VM_PROJECT_GLOBS=(examples tools/examples client_lib/examples tests/vm/clients)

# Copies an ELF file and the shared libraries ldd says it needs.
vm_copy_elf() {  # src dest_in_root root
  local src=$1 dest=$2 root=$3 lib
  mkdir -p "$root$(dirname "$dest")"
  if ! strip --strip-debug -o "$root$dest" "$src" 2>/dev/null; then
    cp -L "$src" "$root$dest"
  fi
  chmod 0755 "$root$dest"
  ldd "$src" 2>/dev/null | awk '
    $2 == "=>" && $3 ~ /^\// { print $3 }
    $1 ~ /^\// { print $1 }' | while read -r lib; do
    # Libraries from the build tree (libcxlpool.so.0, reached by RUNPATH)
    # go to /lib: the build folder's path may lie under a folder the guest
    # mounts over (a clone in /tmp is hidden by the guest's tmpfs /tmp), and
    # the loader falls back to /lib when the RUNPATH folder is missing.
    case $lib in
      /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) ;;
      *) lib_dest=/lib/$(basename "$lib")
         [[ -e $root$lib_dest ]] || cp -L "$lib" "$root$lib_dest"
         continue ;;
    esac
    [[ -e $root$lib ]] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

vm_is_elf() {
  [[ -f $1 && -x $1 ]] && [[ $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]
}

vm_build_initramfs() {
  local root=$1 out=$2 here
  here=$VM_SRC/tests/vm
  rm -rf "$root"
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,etc,proc,sys,dev,run,tmp,out,root}
  mkdir -p "$root"/opt/cxlpool/bin "$root"/vm/topologies "$root"/lib/modules

  # busybox (static from busybox-static; a dynamic one gets its libs copied).
  local bb
  bb=$(command -v busybox) || { vm_log "SKIP: busybox not installed"; return 77; }
  vm_copy_elf "$bb" /bin/busybox "$root"
  local applet
  for applet in $("$bb" --list); do
    [[ -e $root/bin/$applet ]] || ln -s busybox "$root/bin/$applet"
  done

  # kmod: modprobe/insmod that understand modules.dep.bin and libkmod users.
  local kmod_bin
  kmod_bin=$(command -v kmod) || { vm_log "SKIP: kmod not installed"; return 77; }
  vm_copy_elf "$kmod_bin" /sbin/kmod "$root"
  for applet in modprobe insmod rmmod lsmod modinfo depmod; do
    rm -f "$root/bin/$applet"
    ln -sf kmod "$root/sbin/$applet"
  done

  local t
  for t in "${VM_GUEST_TOOLS[@]}"; do
    [[ -x $t ]] || { vm_log "SKIP: $t missing (scripts/install-deps.sh --vm)"; return 77; }
    vm_copy_elf "$t" "/usr/bin/$(basename "$t")" "$root"
  done

  for t in ${VM_EXTRA_TOOLS[@]+"${VM_EXTRA_TOOLS[@]}"}; do
    [[ -x $t ]] || { vm_log "SKIP: $t missing"; return 77; }
    vm_copy_elf "$t" "/usr/bin/$(basename "$t")" "$root"
  done

  cp -a "$VM_KDIR/lib/modules/$VM_KVER" "$root/lib/modules/"

  # The project's binaries, whatever exists at the time.
  VM_PROJECT_BINS=()
  local rel f name
  local -A seen=()
  for rel in "${VM_PROJECT_CANDIDATES[@]}"; do
    f=$VM_BUILD/$rel
    vm_is_elf "$f" || continue
    name=$(basename "$f")
    vm_copy_elf "$f" "/opt/cxlpool/bin/$name" "$root"
    seen[$name]=1
    VM_PROJECT_BINS+=("$name")
  done
  for rel in "${VM_PROJECT_GLOBS[@]}"; do
    [[ -d $VM_BUILD/$rel ]] || continue
    for f in "$VM_BUILD/$rel"/*; do
      vm_is_elf "$f" || continue
      name=$(basename "$f")
      [[ -n ${seen[$name]:-} ]] && continue
      vm_copy_elf "$f" "/opt/cxlpool/bin/$name" "$root"
      seen[$name]=1
      VM_PROJECT_BINS+=("$name")
    done
  done
  printf '%s\n' "${VM_PROJECT_BINS[@]}" >"$root/opt/cxlpool/MANIFEST"

  # Guest scripts.
  install -m 0755 "$here/guest/init" "$root/init"
  cp "$here"/guest/*.sh "$root/vm/"
  cp "$here"/topologies/*.sh "$root/vm/topologies/"
  [[ -n ${VM_EXEC:-} ]] && printf '%s\n' "$VM_EXEC" >"$root/vm/exec.sh"
  [[ -n ${VM_EXTRA_ROOT:-} ]] && cp -a "$VM_EXTRA_ROOT/." "$root/"

  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' \
    >"$root/etc/passwd"
  printf 'root:x:0:\ncxlpool:x:900:\nnogroup:x:65534:\n' >"$root/etc/group"
  echo "cxlpool-vm" >"$root/etc/hostname"
  # libkmod, cxl and daxctl look here; an empty modprobe.d keeps ndctl's
  # host rules out of the guest.
  mkdir -p "$root/etc/modprobe.d"

  (cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$out"
}
