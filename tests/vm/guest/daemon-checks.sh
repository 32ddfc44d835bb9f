# Guest side (busybox sh): the daemon and its clients on a real kernel.
# Where the pages of a lease are is asked of the kernel (cxlpool-vm-probe,
# move_pages on the holder's and the daemon's mappings), never of cxlpool.
#
# Each step needs a piece of the project; a missing piece (binary or CLI
# option) is a visible "skip" with the reason, never a silent pass. The hooks
# for pieces that do not exist yet are marked HOOK.
#
# Topology files set, before these run:
#   TOPO_FAR_NODE   a memory-only node (leases asked for there)
#   VM_CXL_NODE     the system-ram CXL node (cxl-ram only), else empty
VM_SOCK=/run/cxlpool/cxlpool.sock
VM_DAEMON_PID=

vm_help_has() {  # vm_help_has "cxlpoolctl alloc" --hold
  $1 --help 2>&1 | grep -q -- "$2"
}

# Polls (bounded) until CMD succeeds; TCG is slow, so the bound is generous,
# and nothing here depends on how long the wait is.
vm_wait_for() {  # tries cmd...
  _tries=$1
  shift
  while [ "$_tries" -gt 0 ]; do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
    _tries=$((_tries - 1))
  done
  return 1
}

vm_lease_count() {
  cxlpoolctl leases --json --socket "$VM_SOCK" 2>/dev/null |
    jq '(if type == "array" then . else .leases end) | length' 2>/dev/null
}

vm_start_daemon() {
  mkdir -p /run/cxlpool
  cxlpoold --socket "$VM_SOCK" >/out/cxlpoold.log 2>&1 &
  VM_DAEMON_PID=$!
  vm_check "cxlpoold starts and listens on $VM_SOCK" vm_wait_for 240 test -S "$VM_SOCK"
}

vm_stop_daemon() {
  [ -n "$VM_DAEMON_PID" ] || return 0
  kill "$VM_DAEMON_PID" 2>/dev/null
  wait "$VM_DAEMON_PID"
  _rc=$?
  # 143 = ended by our SIGTERM.
  case $_rc in
    0 | 143) vm_pass "cxlpoold exits cleanly on SIGTERM" ;;
    *) vm_fail "cxlpoold exit status $_rc on SIGTERM (log: /out/cxlpoold.log)" ;;
  esac
  VM_DAEMON_PID=
}

# Holds a lease with the CLI; sets VM_HOLD_PID. Stdin stays open (a fifo) so a
# --hold that waits for EOF keeps holding.
vm_hold() {  # size node [extra cxlpoolctl args...]
  _size=$1
  _node=$2
  shift 2
  [ -p /tmp/hold.fifo ] || mkfifo /tmp/hold.fifo
  exec 7<>/tmp/hold.fifo
  cxlpoolctl alloc --socket "$VM_SOCK" --size "$_size" ${_node:+--node "$_node"} "$@" --hold \
    <&7 >>/out/hold.log 2>&1 &
  VM_HOLD_PID=$!
  # The lease is mapped once the holder has a memfd mapping the kernel can see.
  vm_wait_for 240 cxlpool-vm-probe nodes "$VM_HOLD_PID"
}

vm_unhold() {
  kill "$VM_HOLD_PID" 2>/dev/null
  wait "$VM_HOLD_PID" 2>/dev/null
  exec 7>&-
}

# A lease on NODE has every page there, seen from the holder and the daemon.
vm_lease_on_node() {  # label node [extra alloc args]
  _label=$1
  _node=$2
  shift 2
  if ! vm_hold 8M "$_node" "$@"; then
    vm_fail "$_label: lease held and mapped (log: /out/hold.log)"
    vm_unhold
    return
  fi
  vm_check "$_label: holder's pages on node $_node (move_pages)" \
    cxlpool-vm-probe expect "$VM_HOLD_PID" "$_node"
  vm_check "$_label: daemon's pages on node $_node (move_pages)" \
    cxlpool-vm-probe expect "$VM_DAEMON_PID" "$_node"
  vm_unhold
  vm_check "$_label: lease released when the holder exits" \
    vm_wait_for 240 sh -c "[ \"\$(cxlpoolctl leases --json --socket $VM_SOCK |
      jq '(if type == \"array\" then . else .leases end) | length')\" = 0 ]"
}

vm_daemon_checks() {
  if ! vm_have cxlpoold; then
    vm_skip "daemon: leases placed on node ${TOPO_FAR_NODE:-?}" "cxlpoold not built yet"
    return
  fi
  if ! vm_have cxlpoolctl; then
    vm_skip "daemon: leases" "cxlpoolctl not built yet"
    return
  fi
  # Where there is no memory-only node (cxl-devdax), leases go to node 0.
  TOPO_FAR_NODE=${TOPO_FAR_NODE:-0}
  vm_start_daemon || return

  vm_check "cxlpoolctl pools --json" sh -c "cxlpoolctl pools --json --socket $VM_SOCK >/out/pools.json"
  for _id in $(vm_nodes_in /sys/devices/system/node/has_memory); do
    vm_check "pools: node $_id has a pool" jq -e \
      "[(if type == \"array\" then . else .pools end)[] | select(.node == $_id)] | length == 1" \
      /out/pools.json
  done

  if ! vm_help_has "cxlpoolctl alloc" --hold; then
    vm_skip "daemon: leases on node $TOPO_FAR_NODE" "cxlpoolctl alloc has no --hold yet"
  else
    vm_lease_on_node "lease on memory-only node $TOPO_FAR_NODE" "$TOPO_FAR_NODE"
    if [ -n "${VM_CXL_NODE:-}" ]; then
      if vm_help_has "cxlpoolctl alloc" --tier; then
        vm_lease_on_node "tier preference cxl" "$VM_CXL_NODE" --tier cxl
      else
        vm_skip "tier preference cxl lands on node $VM_CXL_NODE" "cxlpoolctl alloc has no --tier"
      fi
    fi
    # Strict placement on a node that cannot hold the request: refused, and
    # the daemon keeps serving.
    _kb=$(awk '/MemTotal:/ { print $4 }' /sys/devices/system/node/node$TOPO_FAR_NODE/meminfo)
    if vm_help_has "cxlpoolctl alloc" --strict; then
      vm_check "strict lease larger than node $TOPO_FAR_NODE is refused" sh -c \
        "! cxlpoolctl alloc --socket $VM_SOCK --size $((_kb * 2048)) --node $TOPO_FAR_NODE --strict"
      vm_check "daemon still serves after the refusal" \
        sh -c "cxlpoolctl pools --json --socket $VM_SOCK >/dev/null"
    else
      vm_skip "strict lease on a full node is refused" "cxlpoolctl alloc has no --strict"
    fi
  fi

  # HOOK: shared named lease written by one process and read by another. Needs
  # a client with shared leases (example/test client); none exists yet.
  if vm_have cxlpool-shared-check; then
    vm_check "shared lease on node ${VM_CXL_NODE:-$TOPO_FAR_NODE} crosses processes intact" \
      cxlpool-shared-check --socket "$VM_SOCK" --node "${VM_CXL_NODE:-$TOPO_FAR_NODE}" --size 4M
  else
    vm_skip "shared lease written by one process, read by another" \
      "no shared-lease client built yet (HOOK in daemon-checks.sh)"
  fi

  vm_stop_daemon
}
