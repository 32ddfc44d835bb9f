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
  if cxlpool-vm-client 2>&1 | grep -q hold; then
    topo_devdax_restart
  else
    vm_skip "devdax lease across a daemon restart" "cxlpool-vm-client has no hold command"
  fi
}

# A devdax lease survives a SIGKILL of its daemon. The main daemon is an
# ad-hoc --socket instance without a journal, so a second one with a state
# directory runs on its own socket (the static device is free: the check
# above released it). Its holder's libcxlpool hands /dev/$VM_DAX_DEV back
# after the restart (RECLAIM, matched by st_rdev); the device is not granted
# twice; after the release, or when the holder died while the daemon was
# down, a new lease gets it.
VM_R_SOCK=/run/cxlpool/restart.sock
VM_R_PID=
vm_restart_daemon_start() {
  rm -f "$VM_R_SOCK"
  cxlpoold --foreground --config /out/cxlpoold.toml --socket "$VM_R_SOCK" \
    --state-dir /run/cxlpool/restart-state --grace-period 60 >>/out/cxlpoold-restart.log 2>&1 &
  VM_R_PID=$!
  vm_wait_for 240 test -S "$VM_R_SOCK"
}
vm_restart_daemon_kill() {
  kill -9 "$VM_R_PID" 2>/dev/null
  wait "$VM_R_PID" 2>/dev/null
}
# Starts a holder of a whole-device lease (stdin: fifo on fd 7); sets VM_H_PID.
vm_restart_holder() {
  rm -f /tmp/hold.in /out/hold.out
  mkfifo /tmp/hold.in
  CXLPOOL_RECONNECT_TIMEOUT_MS=300000 cxlpool-vm-client hold --socket "$VM_R_SOCK" --size $((2 << 20)) --tier devdax --strict \
    --expect-backing devdax --touch-mib 2 </tmp/hold.in >/out/hold.out 2>&1 &
  VM_H_PID=$!
  exec 7>/tmp/hold.in
  vm_check "restart: a holder has the devdax lease" vm_wait_for 240 grep -q READY /out/hold.out
}
vm_devdax_place_on() {  # the device can be leased (and is released again)
  cxlpool-vm-client place --socket "$VM_R_SOCK" --size $((2 << 20)) --tier devdax --strict \
    --expect-backing devdax --touch-mib 2
}
vm_devdax_refused_on() {  # ... or is refused because it is taken
  cxlpool-vm-client place --socket "$VM_R_SOCK" --size $((2 << 20)) --tier devdax --strict \
    >/tmp/dup.out 2>&1
  cat /tmp/dup.out
  grep -q "resource exhausted" /tmp/dup.out
}
topo_devdax_restart() {
  vm_check "restart: cxlpoold with a state directory starts" vm_restart_daemon_start || return
  vm_restart_holder
  vm_restart_daemon_kill
  vm_check "restart: cxlpoold restarts on the journal" vm_restart_daemon_start
  vm_check "restart: the holder's library handed $VM_DAX_DEV back (RECLAIM accepted)" \
    vm_wait_for 240 grep -q "reclaim: 1 accepted, 0 rejected" /out/cxlpoold-restart.log
  vm_check "restart: $VM_DAX_DEV is not granted twice" vm_devdax_refused_on
  echo release >&7
  exec 7>&-
  wait "$VM_H_PID"
  _rc=$?
  cat /out/hold.out >>"$VM_LOG"
  vm_check_eq "restart: holder's data intact, lease not revoked, released ($(tail -n 1 /out/hold.out))" \
    "$_rc" 0
  vm_check "restart: $VM_DAX_DEV leased again after the release" vm_devdax_place_on
  # The holder dies while the daemon is down: the device is free after the restart.
  vm_restart_holder
  vm_restart_daemon_kill
  kill -9 "$VM_H_PID" 2>/dev/null
  wait "$VM_H_PID" 2>/dev/null
  exec 7>&-
  vm_check "restart: cxlpoold restarts after its lease holder died" vm_restart_daemon_start
  vm_check "restart: the dead holder's $VM_DAX_DEV is free again" vm_devdax_place_on
  kill "$VM_R_PID" 2>/dev/null
  wait "$VM_R_PID" 2>/dev/null
}
