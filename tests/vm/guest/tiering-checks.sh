# Guest side (busybox sh): the tiering engine on a real kernel with a DRAM
# node and a CXL node (the cxl-ram topology). Where pages are is asked of the
# kernel (cxlpool-vm-tier: move_pages on the holder's own mapping), and the
# daemon's account of it is read back with cxlpoolctl.
#
#  - a hot lease on CXL moves to DRAM in place while two threads read and
#    write it through the copy helpers; not a byte is lost;
#  - a dont_need lease on DRAM moves to CXL;
#  - a lease pinned with io_uring fixed buffers (the stand-in for a CUDA
#    registration) moves through the cooperative path: the pins are dropped
#    at the holder's safe point and registered again;
#  - with daemon.max_extent = "2M" (leases of several extents): a hot lease
#    of 4 extents moves from CXL to DRAM extent by extent while two threads
#    write it, then back to CXL; each extent's pages are counted alone; a
#    pinned one moves all 4 extents in one cooperative pause;
#  - the daemon is SIGKILLed in the middle of a paced migration; the next
#    daemon finishes it after the holder hands the lease back, with the
#    accounting on the right pool and the data intact;
#  - the same, but the next daemon has no room on DRAM (pools.node.0
#    capacity below the lease), so it moves the pages back to CXL, paced; it
#    too is SIGKILLed half way, and a third daemon goes on with the move back:
#    CXL accounts the lease, DRAM nothing, every page on CXL, data intact;
# cxlpool-bench TIER (T1, T2) is not run here (minutes under TCG); run it with
#   tests/vm/run-vm-tests.sh --exec 'cxlpool-bench --only tier --quick
#     --daemon /opt/cxlpool/bin/cxlpoold' cxl-ram
# Each step needs a piece of the project; a missing piece is a visible skip.
VM_TIER_SOCK=/run/cxlpool/tier.sock
VM_TIER_PID=

vm_tier_config() {  # rate_limit_mbps [max_extent [node0_capacity]]
  cat <<CONF
[daemon]
grace_period = 120
${2:+max_extent = \"$2\"}
[pools]
[tiering]
interval = "200ms"
min_residency = "0s"
rate_limit_mbps = $1
cooperative_deadline = "120s"
max_pause = "600s"
CONF
  [ -z "${3:-}" ] || printf '[pools.node.0]\ncapacity = "%s"\n' "$3"
}

vm_tier_json() {
  cxlpoolctl tiering --json --all --socket "$VM_TIER_SOCK" 2>>"$VM_LOG"
}

# True while a lease's move is under way with at least `min` (default 1) of
# its extents on the target and more to go ("K of N extents on <pool> (node
# T)", min <= K < N); any target, or node T when given. `moving` says so for
# the whole move, also while the next extent waits for the rate limit (a
# window of (N - min) x 2 s at 1 MiB/s). The answer is kept in
# /tmp/tier-now.json.
vm_tier_half_moved() {  # [target_node [min]]
  vm_tier_json >/tmp/tier-now.json &&
    jq -e --arg to "${1:-}" --argjson min "${2:-1}" '
           ([.leases[] | .moving // "" |
             capture(": (?<k>[0-9]+) of (?<n>[0-9]+) extents on [^ ]+ [(]node (?<t>[0-9]+)[)]") |
             select((.k | tonumber) >= $min and (.k | tonumber) < (.n | tonumber) and
                    ($to == "" or .t == $to))] | length > 0)' \
      /tmp/tier-now.json >/dev/null
}

# SIGKILLs the daemon, keeping what it said last (tier-before-kill-$1.json).
vm_tier_kill() {  # tag
  kill -9 "$VM_TIER_PID"
  cp /tmp/tier-now.json "/out/tier-before-kill-$1.json"
  wait "$VM_TIER_PID" 2>/dev/null
  VM_TIER_PID=
  vm_note "tiering: daemon SIGKILLed mid-migration ($1): $(jq -c '[.leases[] | .moving // empty]' /tmp/tier-now.json 2>&1 | cut -c1-300)"
}

# The pools' account: node $1 holds $2 leased bytes and node $3 none (all free).
vm_tier_pools_hold() {  # node bytes empty_node file
  jq -e --argjson n "$1" --argjson b "$2" --argjson e "$3" \
    '(if type == "array" then . else .pools end) as $p |
     ([$p[] | select(.numa_node == $n and .leased_bytes == $b)] | length == 1) and
     ([$p[] | select(.numa_node == $e and .leased_bytes == 0 and .free_bytes == .capacity_bytes)] | length == 1)' \
    "$4"
}

vm_tier_start() {  # rate_limit_mbps [max_extent [node0_capacity]]
  vm_tier_config "$1" "${2:-}" "${3:-}" >/out/tier.toml
  cxlpoold --foreground --config /out/tier.toml --socket "$VM_TIER_SOCK" \
    --state-dir /out/tier-state >>/out/tier-daemon.log 2>&1 &
  VM_TIER_PID=$!
  # The socket file may be a dead daemon's: wait for one that answers.
  vm_wait_for 480 cxlpoolctl pools --socket "$VM_TIER_SOCK"
}

# After a failed check: the daemon's last words and its tiering state on the
# console, since the result disk may never be written.
vm_tier_show_daemon() {
  tail -n 25 /out/tier-daemon.log | cut -c1-400 | sed 's/^/CXLPOOL-VM-NOTE daemon: /'
  vm_tier_json | jq -c '{in_flight, leases: [.leases[] | select(.moving != null)]}' 2>&1 |
    cut -c1-2000 | sed 's/^/CXLPOOL-VM-NOTE tiering: /'
}

vm_tier_stop() {
  [ -n "$VM_TIER_PID" ] || return 0
  kill "$VM_TIER_PID" 2>/dev/null
  wait "$VM_TIER_PID" 2>/dev/null
  VM_TIER_PID=
}

vm_tiering_checks() {
  if [ -z "${VM_CXL_NODE:-}" ]; then
    vm_skip "tiering: leases move between DRAM and CXL" "no CXL system-ram node in this topology"
    return
  fi
  for _b in cxlpoold cxlpoolctl cxlpool-vm-tier; do
    if ! vm_have "$_b"; then
      vm_skip "tiering: leases move between DRAM and CXL" "$_b not built yet"
      return
    fi
  done
  if ! cxlpoolctl tiering --help >/dev/null 2>&1; then
    vm_skip "tiering: leases move between DRAM and CXL" "cxlpoolctl tiering not built yet"
    return
  fi
  _c=$VM_CXL_NODE
  mkdir -p /run/cxlpool /out/tier-state
  if ! vm_check "tiering: daemon with [tiering] starts" vm_tier_start 0; then
    vm_tier_stop
    return
  fi
  vm_tier_json >/out/tier-start.json
  vm_check "tiering: the daemon says what kernel access sampling it found" \
    jq -e '.kernel | test("DAMON") and test("idle page tracking")' /out/tier-start.json
  vm_check "tiering: a hot 8 MiB lease on CXL node $_c moves to DRAM node 0 in place while 2 threads read and write it; every page there (move_pages), no byte lost" \
    cxlpool-vm-tier move --socket "$VM_TIER_SOCK" --size $((8 << 20)) --node "$_c" \
    --expect-node 0 --threads 2
  vm_check "tiering: a dont_need lease on DRAM moves to CXL node $_c, data intact" \
    cxlpool-vm-tier move --socket "$VM_TIER_SOCK" --size $((4 << 20)) --node 0 \
    --expect-node "$_c" --threads 0 --hint dont_need
  vm_check "tiering: a lease pinned with io_uring fixed buffers moves through the cooperative path (pins dropped and registered again at the holder's safe point)" \
    cxlpool-vm-tier move --socket "$VM_TIER_SOCK" --size $((4 << 20)) --node "$_c" \
    --expect-node 0 --threads 1 --pinned
  vm_tier_json >/out/tier-after.json
  vm_check "tiering: cxlpoolctl tiering lists the three moves with their reasons" jq -e \
    '[.migrations[] | select(.outcome == "moved" and (.why | length) > 0)] | length >= 3' \
    /out/tier-after.json
  vm_check "tiering: the cooperative move is recorded with the holders' pause" jq -e \
    '[.migrations[] | select(.mode == "cooperative" and .outcome == "moved" and .pause_ns > 0)] | length >= 1' \
    /out/tier-after.json
  cxlpoolctl pools --json --socket "$VM_TIER_SOCK" >/out/tier-pools.json 2>>"$VM_LOG"
  vm_check "tiering: every lease released, every pool back to zero" jq -e \
    '[(if type == "array" then . else .pools end)[] | select(.leased_bytes != 0)] | length == 0' \
    /out/tier-pools.json
  vm_tier_stop

  # Leases of several extents: 8 MiB in 2 MiB extents is 4 memfds, each a
  # unit the engine moves alone (each its own history record).
  if vm_check "tiering: daemon with 2 MiB extents (daemon.max_extent) starts" vm_tier_start 0 2M; then
    vm_check "tiering: a hot 8 MiB lease of 4 extents on CXL node $_c moves to DRAM node 0 extent by extent while 2 threads read and write it, then (dont_need) back to CXL; every extent's pages on the node each time (move_pages), no byte lost" \
      cxlpool-vm-tier move --socket "$VM_TIER_SOCK" --size $((8 << 20)) --node "$_c" \
      --expect-node 0 --threads 2 --extent $((2 << 20)) --then-hint dont_need --then-expect "$_c"
    vm_check "tiering: a pinned lease of 4 extents moves through the cooperative path, every extent in one pause" \
      cxlpool-vm-tier move --socket "$VM_TIER_SOCK" --size $((8 << 20)) --node "$_c" \
      --expect-node 0 --threads 1 --pinned --extent $((2 << 20))
    vm_tier_json >/out/tier-extents.json
    vm_check "tiering: cxlpoolctl tiering records each of the 4 extents promoted and demoted in place" jq -e \
      '[.migrations[] | select(.outcome == "moved" and .mode == "in-place")] as $m |
       ([$m[] | select(.direction == "promote") | .unit] | unique | length) == 4 and
       ([$m[] | select(.direction == "demote") | .unit] | unique | length) == 4' \
      /out/tier-extents.json
    vm_check "tiering: the pinned lease's 4 extents moved in one cooperative migration" jq -e \
      '[.migrations[] | select(.mode == "cooperative" and .outcome == "moved")] |
       length == 4 and (map(.unit) | unique | length) == 4 and (map(.pause_ns) | max) > 0' \
      /out/tier-extents.json
    cxlpoolctl pools --json --socket "$VM_TIER_SOCK" >/out/tier-pools-extents.json 2>>"$VM_LOG"
    vm_check "tiering: leases of several extents released, every pool back to zero" jq -e \
      '[(if type == "array" then . else .pools end)[] | select(.leased_bytes != 0)] | length == 0' \
      /out/tier-pools-extents.json
  fi
  vm_tier_stop

  # Killed mid-migration: paced at 1 MiB/s (2 MiB steps) a 32 MiB move of 16
  # extents takes ~30 s. The kill comes as soon as the daemon says at least
  # one extent is on the target and the move goes on, so it finds the move
  # half done however slow the guest is (tier-before-kill-forward.json says how far);
  # a kill after the move ended would leave nothing to resume.
  if ! vm_check "tiering: daemon paced to 1 MiB/s starts" vm_tier_start 1 2M; then
    vm_tier_stop
    return
  fi
  [ -p /tmp/tier.fifo ] || mkfifo /tmp/tier.fifo
  exec 9<>/tmp/tier.fifo
  cxlpool-vm-tier hold --socket "$VM_TIER_SOCK" --size $((32 << 20)) --node "$_c" \
    --threads 1 --expect-node 0 <&9 >/out/tier-hold.log 2>&1 &
  _h=$!
  if vm_check "tiering: a hot lease is held on CXL node $_c" \
    vm_wait_for 480 grep -q '^READY' /out/tier-hold.log &&
    vm_check "tiering: its paced migration to DRAM is under way, some extents moved and more to go" \
      vm_wait_for 480 vm_tier_half_moved; then
    vm_tier_kill forward
    vm_check "tiering: the next daemon starts (unpaced)" vm_tier_start 0 2M
    vm_check "tiering: it finishes the interrupted move of every extent once the holder hands the lease back" \
      vm_wait_for 120 sh -c "cxlpoolctl tiering --json --all --socket $VM_TIER_SOCK |
        jq -e '([.migrations[] | select(.direction == \"resume\" and .outcome == \"moved\")] | length >= 1) and
               .in_flight == null and ([.leases[] | select(.moving != null)] | length == 0)'"
    [ "$?" -eq 0 ] || vm_tier_show_daemon
    cxlpoolctl pools --json --socket "$VM_TIER_SOCK" >/out/tier-pools-restart.json 2>>"$VM_LOG"
    vm_check "tiering: after the restart DRAM node 0 accounts the lease and CXL node $_c nothing" \
      vm_tier_pools_hold 0 $((32 << 20)) "$_c" /out/tier-pools-restart.json
  fi
  echo done >&9
  wait "$_h"
  vm_check_eq "tiering: the holder's data is intact and every page is on node 0 (exit status)" "$?" 0
  exec 9>&-
  vm_tier_json >/out/tier-restart.json
  vm_tier_stop
  vm_tier_move_back_kill "$_c"
}

# Killed during a move back. A will_need lease of 16 extents on CXL moves to
# DRAM at 1 MiB/s; once 3 extents are there the daemon is SIGKILLed. The next
# daemon has DRAM node 0 capped below the lease (capacity 8 MiB), so it
# cannot finish the move and moves every extent back to CXL instead, also
# paced; it is SIGKILLed once one extent is back, which leaves the extents
# after it on DRAM (the move goes in lease order). A third daemon, unpaced and
# still without room on DRAM, must go on with the move back (a "rollback"
# record), not start it again elsewhere: CXL accounts the lease, DRAM nothing,
# and the holder finds every page of it on CXL (move_pages), its data intact.
# The lease stays hot there, and the engine does not try to promote it
# extent by extent into DRAM that cannot hold all of it.
vm_tier_move_back_kill() {  # cxl_node
  _c=$1
  _sz=$((32 << 20))
  if ! vm_check "tiering: daemon paced to 1 MiB/s starts (move back)" vm_tier_start 1 2M; then
    vm_tier_stop
    return
  fi
  [ -p /tmp/tier.fifo ] || mkfifo /tmp/tier.fifo
  exec 9<>/tmp/tier.fifo
  cxlpool-vm-tier hold --socket "$VM_TIER_SOCK" --size "$_sz" --node "$_c" \
    --threads 1 --hint will_need --expect-node "$_c" <&9 >/out/tier-hold-back.log 2>&1 &
  _h=$!
  # A missed window fails in 2 minutes (with the daemon's last words), well
  # inside the guest's time.
  if vm_check "tiering: a will_need lease of 16 extents is held on CXL node $_c" \
    vm_wait_for 240 grep -q '^READY' /out/tier-hold-back.log &&
    { vm_check "tiering: its paced move to DRAM node 0 has put 3 extents there and goes on" \
      vm_wait_for 240 vm_tier_half_moved 0 3 || { vm_tier_show_daemon; false; }; }; then
    vm_tier_kill forward-then-back
    if vm_check "tiering: the next daemon starts with DRAM node 0 capped at 8 MiB (no room for the lease), paced" \
      vm_tier_start 1 2M 8M &&
      { vm_check "tiering: it moves the lease back to CXL node $_c once the holder hands it back: one extent there, more to go" \
        vm_wait_for 240 vm_tier_half_moved "$_c" 1 || { vm_tier_show_daemon; false; }; }; then
      vm_tier_kill back
      vm_check "tiering: a third daemon starts (unpaced, DRAM still capped)" vm_tier_start 0 2M 8M
      vm_check "tiering: it goes on with the interrupted move back until the lease is whole on CXL" \
        vm_wait_for 120 sh -c "cxlpoolctl tiering --json --all --socket $VM_TIER_SOCK |
          jq -e '([.migrations[] | select(.direction == \"rollback\")] | length >= 1) and
                 .in_flight == null and ([.leases[] | select(.moving != null)] | length == 0)'"
      [ "$?" -eq 0 ] || vm_tier_show_daemon
      cxlpoolctl pools --json --socket "$VM_TIER_SOCK" >/out/tier-pools-back.json 2>>"$VM_LOG"
      vm_check "tiering: after the move back CXL node $_c accounts the lease and DRAM node 0 nothing" \
        vm_tier_pools_hold "$_c" "$_sz" 0 /out/tier-pools-back.json
      # The holder keeps the lease hot, but DRAM cannot hold all of it, and a
      # lease moves whole: no move is tried (the pool would refuse each one)
      # and the verdict says so.
      vm_check "tiering: the hot lease is not tried on the capped DRAM, and its verdict says it needs room for all of it" \
        vm_wait_for 120 sh -c "cxlpoolctl tiering --json --all --socket $VM_TIER_SOCK >/out/tier-capped.json &&
          jq -e '([.leases[].units[].verdict | test(\"which moves whole\")] | any) and
                 ([.migrations[] | select(.outcome == \"refused\")] | length == 0)' /out/tier-capped.json"
    fi
  fi
  echo done >&9
  wait "$_h"
  vm_check_eq "tiering: the holder's data is intact and every page is on CXL node $_c (exit status)" "$?" 0
  exec 9>&-
  vm_tier_json >/out/tier-back.json
  vm_tier_stop
}
