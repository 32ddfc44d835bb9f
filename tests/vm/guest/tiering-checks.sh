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
#  - the same, but the next daemon has room on DRAM only for the extents
#    already there: the lease comes back split (each extent accounted where
#    its pages are) and the extent that was moving goes back to CXL; that
#    daemon is SIGKILLed before the move back is done, and a third one goes
#    on with it; the lease stays split, each extent's pages on the node the
#    daemon accounts it to (move_pages), data intact;
#  - where the guest kernel has DAMON sysfs (CXLPOOL_VM_KERNEL_SUITE=
#    bookworm-backports: Debian's 6.12), a lease on CXL that its holder
#    reads and writes with plain loads and stores (no copy helper, no hint)
#    is judged hot from DAMON's samples alone and moves to DRAM, the
#    sampler's own live test passes, and a daemon SIGKILLed while its
#    kdamond samples leaves it behind for the next daemon to take back;
# cxlpool-bench TIER (T1, T2) is not run here (minutes under TCG); run it with
#   tests/vm/run-vm-tests.sh --exec 'cxlpool-bench --only tier --quick
#     --daemon /opt/cxlpool/bin/cxlpoold' cxl-ram
# Each step needs a piece of the project; a missing piece is a visible skip.
VM_TIER_SOCK=/run/cxlpool/tier.sock
VM_TIER_PID=

vm_tier_config() {  # rate_limit_mbps [max_extent [node0_capacity [tiering_lines]]]
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
${4:-}
CONF
  [ -z "${3:-}" ] || printf '[pools.node.0]\ncapacity = "%s"\n' "$3"
}

vm_tier_json() {
  cxlpoolctl tiering --json --all --socket "$VM_TIER_SOCK" 2>>"$VM_LOG"
}

# True while a lease has at least `min` (default 1) of its extents on node T
# (default 0), but not all of them, and the move of another one is in
# flight, begun less than `age` seconds ago (default 3): with 8 MiB extents
# paced at 1 MiB/s each move takes ~8 s, so a kill right after this finds
# it under way. The answer is kept in /tmp/tier-now.json.
vm_tier_half_moved() {  # [target_node [min [age]]]
  vm_tier_json >/tmp/tier-now.json &&
    jq -e --argjson to "${1:-0}" --argjson min "${2:-1}" --argjson age "${3:-3}" '
      (.in_flight // "" | capture("[(]lease (?<l>[0-9]+) unit [0-9]+, begun (?<s>[0-9.]+) s ago[)]")) as $f |
      ($f.s | tonumber) < $age and
      ([.leases[] | select((.lease_id | tostring) == $f.l and .moving != null) |
        ([.units[] | select(.numa_node == $to)] | length) as $k |
        select($k >= $min and $k < (.units | length))] | length > 0)' \
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

# The pools' account of a split lease: DRAM node 0 holds $1 leased bytes and
# node $2 holds $3.
vm_tier_pools_split() {  # dram_bytes cxl_node cxl_bytes file
  jq -e --argjson d "$1" --argjson c "$2" --argjson x "$3" \
    '(if type == "array" then . else .pools end) as $p |
     ([$p[] | select(.numa_node == 0 and .leased_bytes == $d)] | length == 1) and
     ([$p[] | select(.numa_node == $c and .leased_bytes == $x)] | length == 1)' \
    "$4"
}

vm_tier_start() {  # rate_limit_mbps [max_extent [node0_capacity [tiering_lines]]]
  vm_tier_config "$1" "${2:-}" "${3:-}" "${4:-}" >/out/tier.toml
  cxlpoold --foreground --config /out/tier.toml --socket "$VM_TIER_SOCK" \
    --state-dir /out/tier-state >>/out/tier-daemon.log 2>&1 &
  VM_TIER_PID=$!
  # The socket file may be a dead daemon's: wait for one that answers.
  vm_wait_for 480 cxlpoolctl pools --socket "$VM_TIER_SOCK"
}

# After a failed check: the daemon's last words and its tiering state on the
# console, since the result disk may never be written.
vm_tier_show_daemon() {
  # Its warnings, errors and restart lines (not the connection chatter).
  grep -E '^[0-9-]+ [0-9:.]+ [WEF] |restart:|tiering:' /out/tier-daemon.log | tail -n 30 |
    cut -c1-400 | sed 's/^/CXLPOOL-VM-NOTE daemon: /'
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

  # Killed mid-migration: paced at 1 MiB/s (2 MiB steps) a 32 MiB lease of 4
  # extents of 8 MiB moves in ~8 s an extent. The kill comes as soon as the
  # daemon says at least one extent is on the target and the next one's move
  # began less than 3 s ago, so it finds that move under way however slow
  # the guest is (tier-before-kill-forward.json says how far).
  if ! vm_check "tiering: daemon paced to 1 MiB/s starts" vm_tier_start 1 8M; then
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
      vm_wait_for 480 vm_tier_half_moved 0 1; then
    vm_tier_kill forward
    vm_check "tiering: the next daemon starts (unpaced)" vm_tier_start 0 8M
    vm_check "tiering: it finishes the interrupted extent's move once the holder hands the lease back, and the hot lease's other extents follow" \
      vm_wait_for 120 sh -c "cxlpoolctl tiering --json --all --socket $VM_TIER_SOCK |
        jq -e '([.migrations[] | select(.direction == \"resume\" and .outcome == \"moved\")] | length >= 1) and
               .in_flight == null and ([.leases[] | select(.moving != null)] | length == 0) and
               ([.leases[].units[] | select(.numa_node != 0)] | length == 0)'"
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
  vm_tier_damon "$_c"
}

# DAMON on a real kernel: the only signal is the kernel's sampling of the
# holder's plain CPU accesses.
vm_tier_damon() {  # cxl_node
  if [ ! -d /sys/kernel/mm/damon/admin ]; then
    vm_skip "tiering: DAMON's samples alone make a lease hot" \
      "no DAMON sysfs in this kernel (CXLPOOL_VM_KERNEL_SUITE=bookworm-backports has it)"
    return
  fi
  if vm_have tiering_damon_live_test; then
    vm_check "tiering: DamonSampler on this kernel sees a touched range hot and an untouched one cold (tiering_damon_live_test)" \
      tiering_damon_live_test
  fi
  if ! vm_check "tiering: daemon with sampling = \"damon\" starts" \
    vm_tier_start 0 "" "" 'sampling = "damon"'; then
    vm_tier_stop
    return
  fi
  vm_tier_json >/out/tier-damon-start.json
  vm_check "tiering: the daemon samples with DAMON" \
    jq -e '.kernel | test("kernel access sampling: damon")' /out/tier-damon-start.json ||
    jq -r .kernel /out/tier-damon-start.json | cut -c1-400 | sed 's/^/CXLPOOL-VM-NOTE /'
  vm_check "tiering: a lease on CXL node $1 written and read with plain stores and loads by 2 threads (no copy helper, no hint) moves to DRAM node 0 on DAMON's samples; every page there (move_pages), no byte lost" \
    cxlpool-vm-tier move --socket "$VM_TIER_SOCK" --size $((8 << 20)) --node "$1" \
    --expect-node 0 --threads 2 --plain || vm_tier_show_daemon
  vm_tier_json >/out/tier-damon.json
  vm_check "tiering: cxlpoolctl tiering says the move came from sampled accesses" jq -e \
    '[.migrations[] | select(.outcome == "moved" and .direction == "promote")] | length >= 1' \
    /out/tier-damon.json
  vm_tier_stop
  vm_check "tiering: the daemon's kdamond is gone after it stops" \
    sh -c '[ "$(cat /sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds)" = 0 ]'
  vm_tier_damon_kill
}

# A daemon SIGKILLed while its kdamond samples a held lease leaves the
# kdamond running; the next daemon on the same state directory takes it back
# (its owner record names the dead one), samples with DAMON again, and
# removes it when it stops. The holder's data stays intact throughout.
vm_tier_damon_kill() {
  _kd=/sys/kernel/mm/damon/admin/kdamonds
  vm_check "tiering: daemon with sampling = \"damon\" starts again" \
    vm_tier_start 0 "" "" 'sampling = "damon"' || { vm_tier_stop; return; }
  [ -p /tmp/tier.fifo ] || mkfifo /tmp/tier.fifo
  exec 9<>/tmp/tier.fifo
  cxlpool-vm-tier hold --socket "$VM_TIER_SOCK" --size $((4 << 20)) --node 0 --threads 1 \
    --plain <&9 >/out/tier-damon-hold.log 2>&1 &
  _h=$!
  if vm_check "tiering: a held lease is sampled (kdamond 0 on)" vm_wait_for 120 sh -c \
    "grep -q '^READY' /out/tier-damon-hold.log && [ \"\$(cat $_kd/0/state 2>/dev/null)\" = on ]"; then
    kill -9 "$VM_TIER_PID"
    wait "$VM_TIER_PID" 2>/dev/null
    VM_TIER_PID=
    vm_check "tiering: the SIGKILLed daemon's kdamond is left behind" \
      sh -c "[ \"\$(cat $_kd/nr_kdamonds)\" = 1 ]"
    vm_check "tiering: the next daemon starts" vm_tier_start 0 "" "" 'sampling = "damon"'
    vm_tier_json >/out/tier-damon-restart.json
    vm_check "tiering: it takes the kdamond back and samples with DAMON" jq -e \
      '.kernel | test("kernel access sampling: damon") and test("took back kdamond 0 left by cxlpoold pid [0-9]+ [(]gone[)]")' \
      /out/tier-damon-restart.json ||
      jq -r .kernel /out/tier-damon-restart.json | cut -c1-400 | sed 's/^/CXLPOOL-VM-NOTE /'
  fi
  echo done >&9
  wait "$_h"
  vm_check_eq "tiering: the held lease's data is intact across the kill (exit status)" "$?" 0
  exec 9>&-
  vm_tier_stop
  vm_check "tiering: no kdamond is left after that daemon stops" \
    sh -c "[ \"\$(cat $_kd/nr_kdamonds)\" = 0 ]"
}

# A lease left split by a kill. A will_need lease of 4 extents of 8 MiB on
# CXL moves to DRAM at 1 MiB/s; once K >= 1 extents are there and the next
# one is moving, the daemon is SIGKILLed. The next daemon has DRAM node 0
# capped at K x 8 MiB + 1 MiB (room for the K extents, not for one more) and
# its tiering engine off: the lease comes back split (K extents accounted to
# DRAM, the others to CXL) and the extent that was moving is journalled to
# move back to CXL; that daemon is SIGKILLed before anything moves. A third
# daemon (engine on, DRAM still capped, its watermarks at 1%, below the
# 1 MiB left free, so nothing is demoted for pressure) goes on with the move back (a "rollback" record):
# the lease stays split, the pools account exactly its extents, and the
# holder finds each extent's pages on the node the daemon accounts it to
# (move_pages), its data intact.
vm_tier_move_back_kill() {  # cxl_node
  _c=$1
  _sz=$((32 << 20))
  if ! vm_check "tiering: daemon paced to 1 MiB/s starts (split lease)" vm_tier_start 1 8M; then
    vm_tier_stop
    return
  fi
  [ -p /tmp/tier.fifo ] || mkfifo /tmp/tier.fifo
  exec 9<>/tmp/tier.fifo
  cxlpool-vm-tier hold --socket "$VM_TIER_SOCK" --size "$_sz" --node "$_c" \
    --threads 0 --hint will_need <&9 >/out/tier-hold-split.log 2>&1 &
  _h=$!
  # A missed window fails in 2 minutes (with the daemon's last words), well
  # inside the guest's time.
  if vm_check "tiering: a will_need lease of 8 MiB extents is held on CXL node $_c" \
    vm_wait_for 240 grep -q '^READY' /out/tier-hold-split.log &&
    { vm_check "tiering: its paced move to DRAM node 0 has put an extent there and the next one is moving" \
      vm_wait_for 240 vm_tier_half_moved 0 1 || { vm_tier_show_daemon; false; }; }; then
    _k=$(jq '[.leases[] | select(.moving != null) | [.units[] | select(.numa_node == 0)] | length] | first' \
      /tmp/tier-now.json)
    vm_tier_kill split
    _dram=$(jq '[.leases[] | select(.moving != null) | .units[] | select(.numa_node == 0) | .length] | add' \
      /tmp/tier-now.json)
    _cap="$(((_dram >> 20) + 1))M"
    _n=$(jq '[.leases[] | select(.moving != null) | .units | length] | first' /tmp/tier-now.json)
    _cxl=$((_sz - _dram))
    if vm_check "tiering: the next daemon starts with DRAM node 0 capped at $_cap (room for the $_k extents there, not one more), its engine off" \
      vm_tier_start 0 8M "$_cap" 'enabled = false'; then
      cxlpoolctl leases --json --socket "$VM_TIER_SOCK" >/tmp/tier-now.json 2>>"$VM_LOG"
      cp /tmp/tier-now.json /out/tier-leases-split.json
      vm_check "tiering: the lease comes back split ($_k of $_n extents on node0) with the moving extent to go back to CXL" \
        jq -e --argjson k "$_k" --argjson n "$_n" '.[0] | (.spread // "" | test("(^|, )\($k) of \($n) extents [(][^)]*[)] on node0")) and
          (.migration // "" | test("back")) and
          ([.extent_pools // [] | .[] | select(.numa_node == 0)] | length == $k)' /tmp/tier-now.json ||
        { vm_tier_show_daemon; jq -c '.[0] | {pool, spread, migration, moved_reason}' /tmp/tier-now.json |
          cut -c1-600 | sed 's/^/CXLPOOL-VM-NOTE lease: /'; }
      cxlpoolctl pools --json --socket "$VM_TIER_SOCK" >/out/tier-pools-split.json 2>>"$VM_LOG"
      vm_check "tiering: DRAM node 0 accounts its $_k extents and CXL node $_c the others" \
        vm_tier_pools_split "$_dram" "$_c" "$_cxl" /out/tier-pools-split.json
      kill -9 "$VM_TIER_PID"
      wait "$VM_TIER_PID" 2>/dev/null
      VM_TIER_PID=
      vm_check "tiering: a third daemon starts (engine on, unpaced, DRAM still capped)" \
        vm_tier_start 0 8M "$_cap" 'dram_low_watermark = "1%"
dram_high_watermark = "1%"'
      vm_check "tiering: it goes on with the move back of that extent, and nothing is left moving" \
        vm_wait_for 120 sh -c "cxlpoolctl tiering --json --all --socket $VM_TIER_SOCK |
          jq -e '([.migrations[] | select(.direction == \"rollback\" and .outcome == \"moved\")] | length >= 1) and
                 .in_flight == null and ([.leases[] | select(.moving != null)] | length == 0)'" ||
        vm_tier_show_daemon
      cxlpoolctl pools --json --socket "$VM_TIER_SOCK" >/out/tier-pools-back.json 2>>"$VM_LOG"
      vm_check "tiering: the lease stays split: DRAM node 0 accounts its $_k extents and CXL node $_c the others" \
        vm_tier_pools_split "$_dram" "$_c" "$_cxl" /out/tier-pools-back.json
      cxlpoolctl leases --json --socket "$VM_TIER_SOCK" >/out/tier-leases-back.json 2>>"$VM_LOG"
      vm_check "tiering: no move was refused for room" sh -c \
        "cxlpoolctl tiering --json --all --socket $VM_TIER_SOCK |
         jq -e '[.migrations[] | select(.outcome == \"refused\")] | length == 0'"
    fi
  fi
  # Each extent where the daemon says it is (or, if an earlier step failed,
  # no expectation: the holder still checks its data).
  _where=$(jq -r '.[0].extent_pools // [] | map("\(.size_bytes):\(.numa_node)") | join(",")' \
    /out/tier-leases-back.json 2>/dev/null)
  if [ -n "$_where" ]; then echo "extents $_where" >&9; else echo done >&9; fi
  wait "$_h"
  vm_check_eq "tiering: the holder's data is intact and each extent's pages are on the node the daemon accounts it to (exit status)" "$?" 0
  grep '^EXTENTS' /out/tier-hold-split.log | cut -c1-300 | sed 's/^/CXLPOOL-VM-NOTE /'
  exec 9>&-
  vm_tier_json >/out/tier-back.json
  vm_tier_stop
}
