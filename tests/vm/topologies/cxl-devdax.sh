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
  # The devdax lease itself is checked once the daemon is up: topo_daemon_checks.
}

# Called by daemon-checks.sh with the daemon running and a devdax pool
# configured for this region (VM_DAX_REGION). The region is static, so the
# lease is the whole device; only its first 2 MiB are written (CXL under TCG
# is slow). The node comes from the device's target_node in sysfs.
topo_daemon_checks() {
  _node=$(cat /sys/bus/dax/devices/$VM_DAX_DEV/target_node)
  _size=$(cat /sys/bus/dax/devices/$VM_DAX_DEV/size)
  vm_check "devdax lease: 2 MiB asked, whole $VM_DAX_DEV ($_size bytes) leased, data intact" \
    cxlpool-vm-client place --socket "$VM_SOCK" --size $((2 << 20)) --tier devdax \
    --expect-backing devdax --expect-node "$_node" --expect-size "$_size" --touch-mib 2
}
