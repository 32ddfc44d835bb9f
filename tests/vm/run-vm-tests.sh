#!/usr/bin/env bash
# VM tier: boots Debian's own kernel under QEMU with emulated NUMA/HMAT/CXL
# topologies and runs cxlpool's binaries inside. See docs/testing.md.
#
# usage: tests/vm/run-vm-tests.sh [options] [topology...]
#   topology        two-node four-node cxl-ram cxl-devdax cxl-pin (default: all)
#   --shell         after the guest checks, open a shell on the console
#                   (one topology; leave it with `poweroff -f` or Ctrl-A x)
#   --build-dir D   project build folder to take binaries from
#                   (default: $CXLPOOL_BINARY_DIR, else <source>/build)
#   --out D         results folder (default: <build-dir>/vm-results)
#   --exec CMD      run CMD (busybox sh) in the guest after the checks; its
#                   output is on the console and in <out>/<topology>/console.txt
#   --capture       copy each guest's sysfs capture to
#                   tests/topology/fixtures/vm-<topology>/root/
#   --timeout S     host-side limit per guest in seconds (default 420)
#   --list          print the topologies and exit
#   -v              stream the guest console while it runs
# environment:
#   CXLPOOL_VM_CACHE        kernel cache (default ~/.cache/cxlpool-vm)
#   CXLPOOL_VM_KERNEL_PKG   kernel package to use instead of the one
#                           linux-image-amd64 depends on
#   CXLPOOL_VM_KERNEL_SUITE other Debian suite to take linux-image-amd64
#                           from, e.g. bookworm-backports (6.12, with DAMON
#                           sysfs); its apt lists live in the cache folder
#   CXLPOOL_VM_APPEND       extra kernel command-line arguments
#   CXLPOOL_VM_QEMU_ARGS    extra QEMU arguments (split on spaces)
#   CXLPOOL_VM_SKIP=1       skip (exit 77)
# exit: 0 every topology passed; 1 a check, boot or guest failed;
#       77 prerequisites missing (no qemu, busybox, tools or kernel).
#
# No root-only host changes: nothing is mounted, installed or loop-attached.
# KVM is not used (it does not work on our CI machines); QEMU runs with TCG.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_SRC=$(cd "$HERE/../.." && pwd)
ALL_TOPOLOGIES=(two-node four-node cxl-ram cxl-devdax cxl-pin)
# Topology files source guest/ helpers through $VM_DIR (/vm in the guest).
export VM_DIR=$HERE/guest

vm_log() { echo "vm: $*" >&2; }

# shellcheck source=lib/kernel.sh
source "$HERE/lib/kernel.sh"
# shellcheck source=lib/initramfs.sh
source "$HERE/lib/initramfs.sh"
# shellcheck source=lib/guest-run.sh
source "$HERE/lib/guest-run.sh"

shell=0 capture=0 verbose=0 timeout_s=420
VM_EXEC=""
VM_BUILD=${CXLPOOL_BINARY_DIR:-$VM_SRC/build}
out=""
topos=()
while (($#)); do
  case $1 in
    --shell) shell=1 ;;
    --capture) capture=1 ;;
    --exec) VM_EXEC=$2; shift ;;
    --build-dir) VM_BUILD=$2; shift ;;
    --out) out=$2; shift ;;
    --timeout) timeout_s=$2; shift ;;
    -v) verbose=1 ;;
    --list) printf '%s\n' "${ALL_TOPOLOGIES[@]}"; exit 0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) vm_log "unknown option $1"; exit 2 ;;
    *) topos+=("$1") ;;
  esac
  shift
done
((${#topos[@]})) || topos=("${ALL_TOPOLOGIES[@]}")
for t in "${topos[@]}"; do
  [[ -f $HERE/topologies/$t.sh ]] || { vm_log "unknown topology '$t' (--list)"; exit 2; }
done
if ((shell)) && ((${#topos[@]} != 1)); then
  vm_log "--shell takes exactly one topology"
  exit 2
fi
[[ ${CXLPOOL_VM_SKIP:-0} == 1 ]] && { vm_log "SKIP: CXLPOOL_VM_SKIP=1"; exit 77; }
VM_BUILD=$(cd "$VM_BUILD" 2>/dev/null && pwd) || { vm_log "no build folder $VM_BUILD"; exit 2; }
out=${out:-$VM_BUILD/vm-results}
mkdir -p "$out" && out=$(cd "$out" && pwd)

QEMU=$(command -v qemu-system-x86_64) || {
  vm_log "SKIP: qemu-system-x86_64 missing (scripts/install-deps.sh --vm)"
  exit 77
}
for tool in apt-get dpkg-deb depmod modprobe cpio strip flock timeout; do
  command -v "$tool" >/dev/null || { vm_log "SKIP: $tool missing"; exit 77; }
done

t_start=$(date +%s.%N)
vm_kernel_fetch || exit $?
vm_log "kernel $VM_KERNEL_PKG ($VM_KVER)"

# Kernels from 6.3 on (the backports 6.12) need two settings to use Debian
# 12's QEMU 7.2 CXL device: cxl_pci fails its probe when it may not set up
# event-log interrupts, which QEMU 7.2 does not emulate, unless the firmware
# keeps CXL error reporting (pcie_ports=compat: no _OSC control is asked
# for); and a region commits only where the CPU can flush caches by memory
# region, which the kernel refuses under a hypervisor (CPUID bit cleared).
kernel_append="" kernel_qemu=()
if awk -v v="$VM_KVER" 'BEGIN { split(v, p, /[.-]/); exit !(p[1] > 6 || (p[1] == 6 && p[2] >= 3)) }'; then
  kernel_append="pcie_ports=compat"
  kernel_qemu=(-cpu qemu64,-hypervisor)
  vm_log "kernel $VM_KVER: $kernel_append, ${kernel_qemu[*]} (QEMU 7.2's CXL device)"
fi

# One initramfs per invocation (the project's binaries change between runs).
initrd=$out/.initramfs-$$.cpio
vm_build_initramfs "$out/.initramfs-$$" "$initrd" || exit $?
rm -rf "$out/.initramfs-$$"
trap 'rm -f "$initrd"' EXIT
vm_log "initramfs $(($(stat -c %s "$initrd") / 1024)) KiB; project binaries:" \
  "${VM_PROJECT_BINS[*]:-(none built yet)}"
t_prep=$(date +%s.%N)

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Boots one topology; prints its summary line; returns 0 on pass.
run_topology() {
  local topo=$1 work=$out/$1
  rm -rf "$work"
  mkdir -p "$work/out"
  # Each topology file defines topo_host_prepare/topo_qemu_args (host side)
  # and topo_guest_* (guest side); a subshell keeps them apart.
  # shellcheck source=/dev/null
  source "$HERE/topologies/$topo.sh"
  topo_host_prepare "$work" || { vm_log "$topo: host preparation failed"; return 1; }
  local -a targs
  mapfile -t targs < <(topo_qemu_args "$work")
  truncate -s 64M "$work/out.img"

  # tsc=reliable: no clocksource watchdog. On a loaded TCG host it can find
  # the TSC skewed against the HPET and mark it unstable; the static-key flip
  # that follows patches kernel text while the other vCPU runs it, which TCG
  # does not keep coherent ("Oops: int3" in sched_clock_cpu, then a panic).
  # TCG's TSC comes from the host's monotonic clock, so it is reliable.
  local append="console=ttyS0 panic=-1 oops=panic loglevel=4 tsc=reliable cxlpool.topology=$topo"
  ((shell)) && append+=" cxlpool.shell=1"
  ((capture)) && append+=" cxlpool.capture=1"
  [[ -n $kernel_append ]] && append+=" $kernel_append"
  [[ -n ${CXLPOOL_VM_APPEND:-} ]] && append+=" $CXLPOOL_VM_APPEND"
  local -a qextra=("${kernel_qemu[@]}")
  local -a quser=()
  [[ -n ${CXLPOOL_VM_QEMU_ARGS:-} ]] && read -ra quser <<<"$CXLPOOL_VM_QEMU_ARGS"
  qextra+=("${quser[@]}")
  local -a qemu=("$QEMU" -accel tcg -nodefaults -no-user-config -display none -no-reboot
    -kernel "$VM_VMLINUZ" -initrd "$initrd" -append "$append"
    -drive "file=$work/out.img,format=raw,if=none,id=outdisk,cache=unsafe"
    -device virtio-blk-pci,drive=outdisk,bus=pcie.0
    "${targs[@]}" "${qextra[@]}")
  local t0 t1
  t0=$(date +%s.%N)
  vm_qemu_run "$work" "$timeout_s" "$shell" "$verbose" "${qemu[@]}"
  t1=$(date +%s.%N)

  # The guest wrote a tar of its /out to the second disk.
  tar -xf "$work/out.img" -C "$work/out" 2>/dev/null ||
    vm_log "$topo: no guest output on the result disk"
  rm -f "$work/out.img"

  local boot
  boot=$(grep -a '^CXLPOOL-VM-BOOT ' "$work/console.txt" | sed -n 's/.*uptime=\([0-9.]*\).*/\1/p')
  vm_verdict "$topo" "$work" "$timeout_s" "$shell"
  local status=$VM_STATUS why=$VM_WHY result=$VM_RESULT

  if ((capture)) && [[ -d $work/out/sysfs ]]; then
    local dest=$VM_SRC/tests/topology/fixtures/vm-$topo/root
    rm -rf "$dest"
    mkdir -p "$dest"
    cp -a "$work/out/sysfs/." "$dest/"
    vm_log "$topo: sysfs capture saved to ${dest#"$VM_SRC"/}"
  fi

  echo "vm: $topo $status ${result#*status=* } boot=${boot:-?}s wall=$(secs "$t0" "$t1")s${why:+ ($why)}" |
    tee "$work/summary"
  [[ $status == pass ]]
}

failed=0
for topo in "${topos[@]}"; do
  (run_topology "$topo") || failed=1
done
t_end=$(date +%s.%N)
vm_log "prepare $(secs "$t_start" "$t_prep")s, total $(secs "$t_start" "$t_end")s;" \
  "results in $out"
exit $failed
