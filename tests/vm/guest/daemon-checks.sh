# Guest side (busybox sh): the daemon and its clients on a real kernel.
# Where the pages of a lease are is asked of the kernel (cxlpool-vm-probe,
# move_pages on the holder's and the daemon's mappings), never of cxlpool.
#
# Each step needs a piece of the project; a missing piece (binary or CLI
# option) is a visible "skip" with the reason, never a silent pass. Leases are
# checked with our own client (tests/vm/clients, C ABI) and with the
# operator's CLI. A topology may add lease checks in topo_daemon_checks.
#
# Topology files set, before these run:
#   TOPO_FAR_NODE   a memory-only node (leases asked for there)
#   VM_CXL_NODE     the system-ram CXL node (cxl-ram only), else empty
VM_SOCK=/run/cxlpool/cxlpool.sock
VM_DAEMON_PID=
# The pools, whether `pools --json` prints an array or {"pools": [...]}.
VM_POOLS='(if type == "array" then . else .pools end)[]'

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

# Guest configuration: no warm reserve (prefaulting under TCG is slow and the
# nodes are small); the memory-only node's pool is capped at 16 MiB so a
# strict request beyond that meets a full pool; every CPU-less node enabled
# (QEMU's memory-only nodes have no CXL, hmem or nvdimm behind them, so their
# kind is unknown and they are pooled only when the config says so); a
# devdax pool for the static CXL DAX region when the topology has one.
vm_daemon_config() {
  cat <<CONF
[pools]

[pools.node.$TOPO_FAR_NODE]
capacity = "16M"
enabled = true
CONF
  for _c in $(vm_cpuless_nodes); do
    [ "$_c" = "$TOPO_FAR_NODE" ] || printf '\n[pools.node.%s]\nenabled = true\n' "$_c"
  done
  if [ -n "${VM_DAX_REGION:-}" ]; then
    printf '\n[[devdax]]\nregion = "%s"\n' "$VM_DAX_REGION"
  fi
}

vm_start_daemon() {
  mkdir -p /run/cxlpool
  vm_daemon_config >/out/cxlpoold.toml
  vm_check "cxlpoold --check-config" cxlpoold --config /out/cxlpoold.toml --check-config
  cxlpoold --foreground --config /out/cxlpoold.toml --socket "$VM_SOCK" >/out/cxlpoold.log 2>&1 &
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

# Shared lease: one process writes, another attaches and reads it intact,
# with its pages on NODE.
vm_shared_lease() {  # node
  [ -p /tmp/share.fifo ] || mkfifo /tmp/share.fifo
  exec 8<>/tmp/share.fifo
  cxlpool-vm-client share-write vm-shared --socket "$VM_SOCK" --size $((4 << 20)) --node "$1" \
    <&8 >/out/share-write.log 2>&1 &
  _w=$!
  if vm_check "shared lease created on node $1 and written" \
    vm_wait_for 240 grep -q '^READY' /out/share-write.log; then
    vm_check "shared lease read intact by a second process, pages on node $1" \
      cxlpool-vm-client share-read vm-shared --socket "$VM_SOCK" --expect-node "$1"
  fi
  echo done >&8
  wait "$_w"
  vm_check_eq "shared lease writer exit status" "$?" 0
  exec 8>&-
}

# A memory-only node of unknown kind is not pooled by default: the daemon
# says so at start (and how to include it), and pools it once enabled.
vm_unknown_node_not_pooled() {  # node
  if ! vm_have cxlpoold || ! vm_have cxlpoolctl; then
    vm_skip "memory of unknown kind is not pooled by default" "cxlpoold not built yet"
    return
  fi
  mkdir -p /run/cxlpool
  printf '[pools]\n' >/out/cxlpoold-default.toml
  cxlpoold --foreground --config /out/cxlpoold-default.toml --socket /run/cxlpool/default.sock \
    >/out/cxlpoold-default.log 2>&1 &
  _p=$!
  if vm_check "cxlpoold (no node enabled) listens" vm_wait_for 240 test -S /run/cxlpool/default.sock; then
    cxlpoolctl pools --json --socket /run/cxlpool/default.sock >/out/pools-default.json 2>>"$VM_LOG"
    vm_check "pools: no pool on node $1 (unknown kind) by default" jq -e \
      "[$VM_POOLS | select(.numa_node == $1)] | length == 0" /out/pools-default.json
    vm_check "log: node $1 left out, with how to include it" \
      grep -q "node $1 not pooled: CPU-less memory of unknown kind.*\\[pools.node.$1\\] enabled = true" \
      /out/cxlpoold-default.log
    if cxlpoolctl doctor --help >/dev/null 2>&1; then
      cxlpoolctl doctor --json --socket /run/cxlpool/default.sock >/out/doctor-default.json 2>>"$VM_LOG"
      vm_check "doctor: node $1 not pooled, remedy enabled = true" jq -e \
        "[.findings[] | select(.check == \"unpooled_nodes\") | select(.remedy | test(\"pools.node.$1\\\\] enabled = true\"))] | length == 1" \
        /out/doctor-default.json
    fi
  fi
  kill "$_p" 2>/dev/null
  wait "$_p" 2>/dev/null
}

# No leak between tenants (issue 18): uid 4201 fills leases with a pattern
# and releases them, then uid 4202 leases twice those bytes from a pool too
# small to serve them from anything but that memory and reads all zeros
# (cxlpool-vm-client leak). Its own daemon: a socket every uid may use, the
# node's pool capped at 32 MiB, a small warm reserve.
vm_no_leak_between_tenants() {  # node
  if ! vm_have cxlpool-vm-client; then
    vm_skip "no leak between tenants on node $1" "libcxlpool not built yet, so no tests/vm/clients"
    return
  fi
  mkdir -p /run/cxlpool
  cat >/out/cxlpoold-leak.toml <<CONF
[daemon]
socket_mode = "0666"

[pools]
reserve_low = "4M"
reserve_high = "4M"

[pools.node.$1]
capacity = "32M"
enabled = true
CONF
  cxlpoold --foreground --config /out/cxlpoold-leak.toml --socket /run/cxlpool/leak.sock \
    >/out/cxlpoold-leak.log 2>&1 &
  _p=$!
  if vm_check "cxlpoold for the tenant leak check listens" \
    vm_wait_for 240 test -S /run/cxlpool/leak.sock; then
    vm_check "no leak between tenants on node $1: uid 4202 reads zeros where uid 4201 wrote" \
      cxlpool-vm-client leak --socket /run/cxlpool/leak.sock --node "$1" --uid-a 4201 --uid-b 4202
  fi
  kill "$_p" 2>/dev/null
  wait "$_p" 2>/dev/null
}

# Multi-extent leases (issue 18): with daemon.max_extent = "2M" a strict lease
# of 8 MiB + 4 KiB is five extents (five memfds mapped back to back). On every
# node with memory, the CXL node too, the client asks the kernel where every
# page of each extent is (cxlpool-vm-client --expect-extents: the file
# mappings of /proc/self/maps in the lease's range, move_pages per mapping),
# and where the node keeps long-term pins (pools: long_term_pins "yes") the
# same again after an io_uring long-term pin. A node whose pins would move
# the pages (movable CXL) is checked unpinned here; cxl-pin pins there.
vm_multi_extent_placement() {
  if ! vm_have cxlpool-vm-client || ! vm_have cxlpoolctl; then
    vm_skip "multi-extent leases: every page of every extent on its node" \
      "libcxlpool not built yet, so no tests/vm/clients"
    return
  fi
  mkdir -p /run/cxlpool
  {
    printf '[daemon]\nmax_extent = "2M"\n\n[pools]\n'
    for _c in $(vm_cpuless_nodes); do printf '\n[pools.node.%s]\nenabled = true\n' "$_c"; done
  } >/out/cxlpoold-extents.toml
  cxlpoold --foreground --config /out/cxlpoold-extents.toml --socket /run/cxlpool/extents.sock \
    >/out/cxlpoold-extents.log 2>&1 &
  _p=$!
  if vm_check "cxlpoold (max_extent 2M) listens" vm_wait_for 240 test -S /run/cxlpool/extents.sock; then
    cxlpoolctl pools --json --socket /run/cxlpool/extents.sock >/out/pools-extents.json 2>>"$VM_LOG"
    for _n in $(vm_nodes_in /sys/devices/system/node/has_memory); do
      vm_check "multi-extent lease on node $_n: 5 extents, every page of each there (move_pages)" \
        sh -c "cxlpool-vm-client place --socket /run/cxlpool/extents.sock --size $(((8 << 20) + 4096)) \
               --node $_n --strict --expect-node $_n --expect-extents 5 >>$VM_LOG"
      _pins=$(jq -r "$VM_POOLS | select(.numa_node == $_n) | .long_term_pins" /out/pools-extents.json)
      if [ "$_pins" = yes ]; then
        vm_check "multi-extent lease on node $_n long-term pinned: every page of each extent still there" \
          sh -c "cxlpool-vm-client pin --socket /run/cxlpool/extents.sock --size $(((8 << 20) + 4096)) \
                 --node $_n --strict --expect-node $_n --expect-extents 5 >>$VM_LOG"
      else
        vm_note "node $_n: long_term_pins \"$_pins\", its multi-extent lease checked unpinned"
      fi
    done
  fi
  kill "$_p" 2>/dev/null
  wait "$_p" 2>/dev/null
}

vm_daemon_checks() {
  if [ "${TOPO_OWN_DAEMON_CHECKS:-0}" = 1 ]; then
    # The topology started its own daemons with its own configurations; the
    # generic lease checks run on the same hardware elsewhere (cxl-ram).
    vm_note "generic daemon checks left to cxl-ram (same expander)"
    return
  fi
  if ! vm_have cxlpoold; then
    vm_skip "daemon: leases placed on node ${TOPO_FAR_NODE:-?}" "cxlpoold not built yet"
    return
  fi
  # Where there is no memory-only node (cxl-devdax), leases go to node 0.
  TOPO_FAR_NODE=${TOPO_FAR_NODE:-0}
  vm_start_daemon || return

  if vm_have cxlpoolctl && vm_help_has "cxlpoolctl pools" --json; then
    vm_check "cxlpoolctl pools --json" \
      sh -c "cxlpoolctl pools --json --socket $VM_SOCK >/out/pools.json"
    for _id in $(vm_nodes_in /sys/devices/system/node/has_memory); do
      vm_check "pools: node $_id has a pool" jq -e \
        "[$VM_POOLS | select(.numa_node == $_id)] | length == 1" /out/pools.json
    done
    vm_check_eq "pools: node $TOPO_FAR_NODE capacity (configured 16M)" \
      "$(jq -c "$VM_POOLS | select(.numa_node == $TOPO_FAR_NODE) | .capacity_bytes" /out/pools.json)" \
      $((16 << 20))
    if [ -n "${VM_DAX_REGION:-}" ]; then
      vm_check "pools: devdax pool for $VM_DAX_REGION listed" grep -q "$VM_DAX_DEV\|$VM_DAX_REGION" \
        /out/pools.json
    fi
  else
    vm_skip "pools: one per node with memory" "cxlpoolctl pools not built yet"
  fi

  if vm_have cxlpool-vm-client; then
    vm_check "lease on node $TOPO_FAR_NODE: every page there (move_pages), data intact" \
      cxlpool-vm-client place --socket "$VM_SOCK" --size $((8 << 20)) --node "$TOPO_FAR_NODE" \
      --strict --expect-node "$TOPO_FAR_NODE"
    if [ -n "${VM_CXL_NODE:-}" ]; then
      vm_check "tier preference cxl lands on CXL node $VM_CXL_NODE" \
        cxlpool-vm-client place --socket "$VM_SOCK" --size $((4 << 20)) --tier cxl \
        --expect-node "$VM_CXL_NODE"
    fi
    vm_check "strict lease beyond node $TOPO_FAR_NODE's full pool is refused" \
      cxlpool-vm-client refuse --socket "$VM_SOCK" --size $((32 << 20)) --node "$TOPO_FAR_NODE"
    vm_shared_lease "${VM_CXL_NODE:-$TOPO_FAR_NODE}"
    # Topology-specific lease checks (cxl-devdax: the devdax pool).
    if command -v topo_daemon_checks >/dev/null 2>&1; then topo_daemon_checks; fi
  else
    vm_skip "leases placed, refused and shared (cxlpool-vm-client)" \
      "libcxlpool not built yet, so no tests/vm/clients"
  fi

  # The operator's path: `cxlpoolctl alloc --hold`, checked on the holder's
  # and the daemon's mappings.
  if vm_have cxlpoolctl && vm_help_has "cxlpoolctl alloc" --hold; then
    vm_lease_on_node "cxlpoolctl alloc --hold on node $TOPO_FAR_NODE" "$TOPO_FAR_NODE"
  else
    vm_skip "cxlpoolctl alloc --hold on node $TOPO_FAR_NODE" "cxlpoolctl alloc not built yet"
  fi
  if vm_have cxlpool-vm-client; then
    vm_check "daemon still serves a lease on node 0 after all of the above" \
      cxlpool-vm-client place --socket "$VM_SOCK" --size $((2 << 20)) --node 0 --expect-node 0
  else
    vm_check "daemon still running after all of the above" kill -0 "$VM_DAEMON_PID"
  fi
  vm_stop_daemon
  vm_multi_extent_placement
  vm_no_leak_between_tenants "${VM_CXL_NODE:-0}"
}
