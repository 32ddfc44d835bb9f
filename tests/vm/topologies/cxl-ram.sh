# Topology "cxl-ram": one NUMA node with the CPUs and 512 MiB, plus a CXL
# type-3 expander (256 MiB persistent, see guest/cxl.sh). The guest turns it
# into a region, a devdax namespace, then system-ram: a new CPU-less NUMA node
# backed by CXL, onlined movable (daxctl's default).
#
# Sourced by the host (bash) and the guest (busybox sh): POSIX sh only.
. "$VM_DIR/cxl.sh"
TOPO_FAR_NODE=
VM_CXL_NODE=

topo_host_prepare() { cxl_host_prepare "$1"; }
topo_qemu_args() { cxl_qemu_args "$1"; }

topo_guest_setup() {
  _before=$(cat /sys/devices/system/node/has_memory)
  cxl_guest_make_devdax || return 1
  vm_check "daxctl reconfigure-device --mode=system-ram $VM_DAX_DEV" \
    daxctl reconfigure-device --mode=system-ram --force "$VM_DAX_DEV"
  VM_CXL_NODE=$(cat /sys/bus/dax/devices/$VM_DAX_DEV/target_node)
  TOPO_FAR_NODE=$VM_CXL_NODE
  vm_note "has_memory before: $_before, after: $(cat /sys/devices/system/node/has_memory)"
}

topo_guest_checks() {
  _n=/sys/devices/system/node
  vm_check_eq "kernel: $VM_DAX_DEV driver" \
    "$(basename "$(readlink /sys/bus/dax/devices/$VM_DAX_DEV/driver)")" kmem
  vm_check_eq "kernel: CXL node $VM_CXL_NODE has no cpus" "$(cat $_n/node$VM_CXL_NODE/cpulist)" ""
  _has=no
  for _m in $(vm_nodes_in $_n/has_memory); do [ "$_m" = "$VM_CXL_NODE" ] && _has=yes; done
  vm_check_eq "kernel: CXL node $VM_CXL_NODE in has_memory" "$_has" yes
  vm_check "kernel: CXL node's memory blocks online movable" sh -c \
    "for b in $_n/node$VM_CXL_NODE/memory[0-9]*; do grep -q Movable \$b/valid_zones || exit 1; done"
  vm_check "kernel: 4 MiB mbind'ed to CXL node $VM_CXL_NODE lands there and reads back" \
    cxlpool-vm-probe bind "$VM_CXL_NODE" 4
  if vm_have cxlpoolctl && [ -s "$VM_JSON" ]; then
    vm_check_eq "json: CXL node$VM_CXL_NODE kind" "$(vm_jn "$VM_CXL_NODE" .kind)" '"cxl"'
    vm_check_eq "json: CXL node$VM_CXL_NODE zone" "$(vm_jn "$VM_CXL_NODE" .zone)" '"Movable"'
    vm_check_eq "json: $VM_CXL_REGION type" \
      "$(vm_j ".cxl.regions[] | select(.name == \"$VM_CXL_REGION\") | .type")" '"pmem"'
    vm_check_eq "json: node0 kind" "$(vm_jn 0 .kind)" '"dram"'
  fi
  cxl_guest_doctor_movable
}

# cxlpoolctl doctor flags CXL memory onlined movable, and stops flagging it
# once the memory is onlined normal (the kernel lets us choose: the blocks are
# offlined and onlined again with daxctl).
cxl_guest_doctor_movable() {
  if ! vm_have cxlpoolctl || ! cxlpoolctl doctor --help >/dev/null 2>&1; then
    vm_skip "doctor flags CXL memory in ZONE_MOVABLE" "cxlpoolctl doctor not built yet"
    return
  fi
  cxlpoolctl doctor --json >/out/doctor-movable.json 2>>"$VM_LOG"
  vm_check "doctor flags cxl_movable while node $VM_CXL_NODE is movable" jq -e \
    '[.. | objects | select(.check? == "cxl_movable") | select(.severity != "ok")] | length > 0' \
    /out/doctor-movable.json
  vm_check "daxctl offline-memory $VM_DAX_DEV" daxctl offline-memory "$VM_DAX_DEV"
  vm_check "daxctl online-memory --no-movable $VM_DAX_DEV" \
    daxctl online-memory --no-movable "$VM_DAX_DEV"
  vm_check "kernel: CXL node's memory blocks now online in ZONE_NORMAL" sh -c \
    "for b in /sys/devices/system/node/node$VM_CXL_NODE/memory[0-9]*; do
       [ \"\$(cat \$b/valid_zones)\" = Normal ] || exit 1; done"
  cxlpoolctl doctor --json >/out/doctor-normal.json 2>>"$VM_LOG"
  vm_check "doctor no longer flags cxl_movable" jq -e \
    '[.. | objects | select(.check? == "cxl_movable") | select(.severity != "ok")] | length == 0' \
    /out/doctor-normal.json
}
