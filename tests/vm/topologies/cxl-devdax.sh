# Topology "cxl-devdax": the cxl-ram expander (guest/cxl.sh) left in devdax
# mode. On Debian 12's stack the DAX region comes from a pmem namespace, so it
# is static: leased whole, never sub-divided (sub-device leases need a
# volatile CXL RAM region: QEMU 8+/kernel 6.3+, not on this stack).
#
# Sourced by the host (bash) and the guest (busybox sh): POSIX sh only.
. "$VM_DIR/cxl.sh"
TOPO_FAR_NODE=

topo_host_prepare() { cxl_host_prepare "$1"; }
topo_qemu_args() { cxl_qemu_args "$1"; }

topo_guest_setup() {
  cxl_guest_make_devdax || return 1
  # The daemon gets a devdax pool for this region (daemon-checks.sh).
  VM_DAX_REGION=dax_region$(cat "$(dirname "$(readlink -f /sys/bus/dax/devices/$VM_DAX_DEV)")/dax_region/id")
  vm_note "DAX region of $VM_DAX_DEV: $VM_DAX_REGION"
}

topo_guest_checks() {
  _d=/sys/bus/dax/devices/$VM_DAX_DEV
  vm_check_eq "kernel: $VM_DAX_DEV driver" "$(basename "$(readlink $_d/driver)")" device_dax
  vm_check_eq "kernel: no new NUMA node with memory" \
    "$(cat /sys/devices/system/node/has_memory)" "0"
  # Static region: its dax_region cannot be sub-divided (a dynamic one has
  # available_size and create for carving sub-devices).
  vm_check "kernel: static DAX region (no available_size)" \
    sh -c "[ ! -e $(dirname "$(readlink -f $_d)")/dax_region/available_size ]"
  if vm_have cxlpoolctl && [ -s "$VM_JSON" ]; then
    _sel=".dax_devices[] | select(.name == \"$VM_DAX_DEV\")"
    vm_check_eq "json: $VM_DAX_DEV dynamic" "$(vm_j "$_sel | .dynamic")" false
    vm_check_eq "json: $VM_DAX_DEV region type" \
      "$(vm_j ".cxl.regions[] | select(.name == \"$VM_CXL_REGION\") | .type")" '"pmem"'
  fi
  # HOOK: devdax leases (the daemon's devdax pools): the whole device is
  # leased, mapped by a client, written and read back. Needs cxlpoold with a
  # devdax pool configured for this region; not built yet.
  if vm_have cxlpoold && vm_have cxlpool-devdax-check; then
    vm_check "devdax lease of $VM_DAX_DEV served whole" \
      cxlpool-devdax-check --device "$VM_DAX_DEV"
  else
    vm_skip "devdax lease of $VM_DAX_DEV served whole" \
      "no devdax pool client built yet (HOOK in topologies/cxl-devdax.sh)"
  fi
}
