#!/usr/bin/env bash
# VM tier, two guests at once: both map one file of this machine (QEMU
# memory-backend-file, share=on) as an NVDIMM, make it devdax and run a
# cxlpoold that shares it as a [[cluster.shared]] device, in one etcd cluster
# on this machine's loopback. The guests' checks are in
# topologies/shared-pair.sh; vm_pair_test starts the etcd cluster and runs
# this script (see docs/testing.md).
#
# usage: tests/vm/run-pair-vm.sh --etcd 127.0.0.1:P[,127.0.0.1:P...] --etcd-certs DIR
#                                [--build-dir D] [--out D] [--timeout S] [-v]
#   --etcd        the members' client endpoints on 127.0.0.1; the guests dial
#                 10.0.2.2 with the same ports (QEMU user networking forwards
#                 to this machine's 127.0.0.1; nothing leaves the machine)
#   --etcd-certs  a folder with ca.crt, client.crt, client.key (the members'
#                 certificates must name IP 10.0.2.2)
#   --build-dir   project build folder (default: $CXLPOOL_BINARY_DIR, else <source>/build)
#   --out         results folder (default: <build-dir>/vm-results/shared-pair)
#   --timeout S   host-side limit per guest in seconds (default 600)
#   -v            stream guest a's console while it runs
# environment: as run-vm-tests.sh (CXLPOOL_VM_CACHE, CXLPOOL_VM_SKIP=1, ...)
# exit: 0 both guests passed and their slices agree; 1 a check failed;
#       77 prerequisites missing (no qemu, busybox, etcdctl or kernel).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_SRC=$(cd "$HERE/../.." && pwd)
export VM_DIR=$HERE/guest

vm_log() { echo "vm: $*" >&2; }

# shellcheck source=lib/kernel.sh
source "$HERE/lib/kernel.sh"
# shellcheck source=lib/initramfs.sh
source "$HERE/lib/initramfs.sh"
# shellcheck source=lib/guest-run.sh
source "$HERE/lib/guest-run.sh"
# The guests' network card: a kernel cache entry of its own (the cache is
# keyed by the module list), so the other VM tests keep theirs.
VM_MODULES+=(virtio_net)

etcd="" certs="" out="" timeout_s=600 verbose=0
VM_BUILD=${CXLPOOL_BINARY_DIR:-$VM_SRC/build}
while (($#)); do
  case $1 in
    --etcd) etcd=$2; shift ;;
    --etcd-certs) certs=$2; shift ;;
    --build-dir) VM_BUILD=$2; shift ;;
    --out) out=$2; shift ;;
    --timeout) timeout_s=$2; shift ;;
    -v) verbose=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) vm_log "unknown argument $1"; exit 2 ;;
  esac
  shift
done
[[ -n $etcd && -n $certs ]] || { vm_log "--etcd and --etcd-certs are required"; exit 2; }
for f in ca.crt client.crt client.key; do
  [[ -r $certs/$f ]] || { vm_log "no $certs/$f"; exit 2; }
done
[[ ${CXLPOOL_VM_SKIP:-0} == 1 ]] && { vm_log "SKIP: CXLPOOL_VM_SKIP=1"; exit 77; }
VM_BUILD=$(cd "$VM_BUILD" 2>/dev/null && pwd) || { vm_log "no build folder $VM_BUILD"; exit 2; }
out=${out:-$VM_BUILD/vm-results/shared-pair}
mkdir -p "$out" && out=$(cd "$out" && pwd)

QEMU=$(command -v qemu-system-x86_64) || {
  vm_log "SKIP: qemu-system-x86_64 missing (scripts/install-deps.sh --vm)"
  exit 77
}
for tool in apt-get dpkg-deb depmod modprobe cpio strip flock timeout etcdctl; do
  command -v "$tool" >/dev/null || { vm_log "SKIP: $tool missing"; exit 77; }
done
for bin in daemon/cxlpoold tools/cxlpoolctl tests/vm/clients/cxlpool-vm-shared; do
  [[ -x $VM_BUILD/$bin ]] || { vm_log "SKIP: $VM_BUILD/$bin not built"; exit 77; }
done

t_start=$SECONDS
vm_kernel_fetch || exit $?
vm_log "kernel $VM_KERNEL_PKG ($VM_KVER)"

# The guests get etcdctl (their meeting point) and the client certificates.
extra=$out/.extra-$$
rm -rf "$extra"
mkdir -p "$extra/vm/etcd"
cp "$certs"/{ca.crt,client.crt,client.key} "$extra/vm/etcd/"
# shellcheck disable=SC2034  # read by vm_build_initramfs
VM_EXTRA_TOOLS=("$(command -v etcdctl)")
# shellcheck disable=SC2034
VM_EXTRA_ROOT=$extra
initrd=$out/.initramfs-$$.cpio
trap 'rm -rf "$initrd" "$extra" "$out/.initramfs-$$"' EXIT
vm_build_initramfs "$out/.initramfs-$$" "$initrd" || exit $?
vm_log "initramfs $(($(stat -c %s "$initrd") / 1024)) KiB"

# The shared memory: fresh (all zeros) for every run.
shared=$out/shared.raw
rm -f "$shared"
truncate -s 128M "$shared"
guest_eps=${etcd//127.0.0.1:/10.0.2.2:}

# Starts guest ROLE in the background; its QEMU exit status goes to
# <out>/<role>/qemu-rc.
boot_guest() {  # role
  local role=$1 work=$out/$1
  rm -rf "$work"
  mkdir -p "$work/out"
  truncate -s 64M "$work/out.img"
  local append="console=ttyS0 panic=-1 oops=panic loglevel=4 tsc=reliable"
  append+=" cxlpool.topology=shared-pair cxlpool.role=$role cxlpool.etcd=$guest_eps"
  local -a qemu=("$QEMU" -accel tcg -nodefaults -no-user-config -display none -no-reboot
    -machine q35,nvdimm=on -smp 1 -m 512M,slots=2,maxmem=2G
    -kernel "$VM_VMLINUZ" -initrd "$initrd" -append "$append"
    -drive "file=$work/out.img,format=raw,if=none,id=outdisk,cache=unsafe"
    -device virtio-blk-pci,drive=outdisk,bus=pcie.0
    -object "memory-backend-file,id=shm0,share=on,mem-path=$shared,size=128M"
    -device nvdimm,memdev=shm0,id=nv0
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0,bus=pcie.0)
  local v=0
  [[ $role == a ]] && v=$verbose
  (
    vm_qemu_run "$work" "$timeout_s" 0 "$v" "${qemu[@]}"
    echo "$VM_QEMU_RC" >"$work/qemu-rc"
  ) &
}

boot_guest a
boot_guest b
wait

failed=0
for role in a b; do
  work=$out/$role
  tar -xf "$work/out.img" -C "$work/out" 2>/dev/null || vm_log "$role: no guest output on the result disk"
  rm -f "$work/out.img"
  VM_QEMU_RC=$(cat "$work/qemu-rc" 2>/dev/null || echo 1)
  vm_verdict shared-pair "$work" "$timeout_s" 0
  echo "vm: shared-pair guest $role $VM_STATUS ${VM_RESULT#*status=* }${VM_WHY:+ ($VM_WHY)}"
  [[ $VM_STATUS == pass ]] || failed=1
done

# The guests' own lists, compared here too: a's and b's slices disjoint,
# and b's last fill took every slice a had held.
held_a=$(cat "$out/a/out/slices-held" 2>/dev/null)
held_b=$(cat "$out/b/out/slices-held" 2>/dev/null)
filled_b=$(cat "$out/b/out/slices-filled" 2>/dev/null)
if ((!failed)); then
  for o in $held_a; do
    if [[ " $held_b " == *" $o "* ]]; then
      vm_log "slice at $o held by both guests"
      failed=1
    fi
    if [[ " $filled_b " != *" $o "* ]]; then
      vm_log "a's slice at $o never reached b"
      failed=1
    fi
  done
  [[ -n $held_a && -n $held_b ]] || { vm_log "a guest listed no slices"; failed=1; }
fi
rm -f "$shared"
vm_log "shared-pair: a held [$held_a], b held [$held_b], b filled [$filled_b];" \
  "total $((SECONDS - t_start))s; results in $out"
exit $failed
