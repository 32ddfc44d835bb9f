# The emulated CXL type-3 expander shared by the cxl-ram and cxl-devdax
# topologies (QEMU 7.2 + Debian 12's kernel 6.1), host and guest halves.
# POSIX sh: sourced by the host script (bash) and the guest (busybox sh).
#
# QEMU facts this relies on (measured on our CI machine):
#  - a persistent cxl-type3 (memdev= + lsa=); volatile-memdev= needs QEMU 8+;
#  - with a single cxl-rp root port, reads return zeros and writes are lost,
#    so a second, empty root port is added;
#  - labels persist in the LSA file, so backing and label files are created
#    fresh for every run;
#  - CXL memory under TCG moves a few MB/s: keep test buffers to a few MiB.
VM_CXL_MIB=${VM_CXL_MIB:-256}  # a topology may set it before sourcing this file
VM_CXL_SERIAL=3237998593  # 0xc0ffee01, checked against the memdev's serial

cxl_host_prepare() {  # workdir
  rm -f "$1/cxl-mem0.raw" "$1/cxl-lsa0.raw"
  truncate -s "${VM_CXL_MIB}M" "$1/cxl-mem0.raw" &&
    truncate -s 1M "$1/cxl-lsa0.raw"
}

cxl_qemu_args() {  # workdir
  cat <<ARGS
-machine
q35,cxl=on
-smp
2
-m
512M,maxmem=2G,slots=4
-object
memory-backend-file,id=cxl-mem0,share=on,mem-path=$1/cxl-mem0.raw,size=${VM_CXL_MIB}M
-object
memory-backend-file,id=cxl-lsa0,share=on,mem-path=$1/cxl-lsa0.raw,size=1M
-device
pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1
-device
cxl-rp,port=0,bus=cxl.1,id=cxl_rp0,chassis=0,slot=2
-device
cxl-rp,port=1,bus=cxl.1,id=cxl_rp1,chassis=0,slot=3
-device
cxl-type3,bus=cxl_rp0,memdev=cxl-mem0,lsa=cxl-lsa0,id=cxl-pmem0,sn=$VM_CXL_SERIAL
-M
cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G
ARGS
}

# Guest: load the stack, then memdev -> pmem region -> devdax namespace.
# Sets VM_CXL_REGION, VM_ND_REGION, VM_DAX_DEV. Every step is a check.
cxl_guest_make_devdax() {
  # A kernel that onlines hot-added memory itself (auto_online_blocks
  # "online", as Debian's 6.12 does) puts it in ZONE_NORMAL before daxctl
  # can choose; the checks want daxctl's choice (movable unless told).
  _auto=/sys/devices/system/memory/auto_online_blocks
  if [ -w $_auto ] && [ "$(cat $_auto)" != offline ]; then
    vm_note "auto_online_blocks was $(cat $_auto); set to offline so that daxctl onlines"
    echo offline >$_auto
  fi
  vm_check "modprobe CXL/NVDIMM/DAX stack" modprobe -a cxl_acpi cxl_pci cxl_mem cxl_pmem \
    libnvdimm nd_pmem dax_pmem device_dax kmem
  vm_check "kernel: memdev mem0 appears" vm_wait_for 240 test -e /sys/bus/cxl/devices/mem0
  vm_check "kernel: CXL nvdimm bridge appears" \
    vm_wait_for 240 sh -c 'ls /sys/bus/cxl/devices | grep -q nvdimm-bridge'
  # The memdev's CXL nvdimm must be bound (and its nmem on the nd bus) before
  # a pmem region is assembled: kernel 6.1's cxl_pmem oopses (NULL deref in
  # release_mappings) when region probe fails because it is not there yet.
  vm_check "kernel: pmem0 bound to cxl_nvdimm, nmem0 on the nd bus" vm_wait_for 240 \
    sh -c 'test -e /sys/bus/cxl/devices/pmem0/driver && test -e /sys/bus/nd/devices/nmem0'
  _root_dec=$(cxl list -D -d root 2>/dev/null | jq -r '[.[] | select(.pmem_capable == true)][0].decoder')
  vm_check_eq "kernel: a pmem-capable root decoder" "${_root_dec:+yes}" yes || return 1
  cxl create-region -t pmem -d "$_root_dec" -m mem0 >/out/create-region.json 2>>"$VM_LOG"
  vm_check_eq "cxl create-region -t pmem (exit)" "$?" 0 || return 1
  VM_CXL_REGION=$(jq -r .region /out/create-region.json)
  vm_check "kernel: $VM_CXL_REGION committed" sh -c \
    "[ \"\$(cat /sys/bus/cxl/devices/$VM_CXL_REGION/commit)\" = 1 ]"
  vm_check "kernel: nvdimm region for $VM_CXL_REGION" \
    vm_wait_for 240 sh -c 'ndctl list -R | jq -e "length > 0"'
  VM_ND_REGION=$(ndctl list -R | jq -r '.[0].dev')
  ndctl create-namespace -m devdax -r "$VM_ND_REGION" >/out/create-namespace.json 2>>"$VM_LOG"
  vm_check_eq "ndctl create-namespace -m devdax (exit)" "$?" 0 || return 1
  VM_DAX_DEV=$(jq -r '.daxregion.devices[0].chardev' /out/create-namespace.json)
  vm_check "kernel: /dev/$VM_DAX_DEV exists" test -c "/dev/$VM_DAX_DEV"
  vm_check_eq "kernel: mem0 serial (QEMU sn=)" "$(vm_dec "$(cat /sys/bus/cxl/devices/mem0/serial)")" \
    "$VM_CXL_SERIAL"
}
