# Topology "cxl-pin": the cxl-ram expander, larger (512 MiB, so its node gets
# three 128 MiB memory blocks), onlined as system RAM three ways in turn:
# movable (daxctl's default), mixed (one block online_kernel, two
# online_movable) and normal (all three online_kernel). On each, a lease that will be pinned
# long-term (io_uring IORING_REGISTER_BUFFERS, FOLL_LONGTERM as the GPU
# driver pins for cuMemHostRegister) is asked for and pinned, and where its
# pages are is asked of the kernel (move_pages) before and after the pin:
#  - movable: the lease is placed elsewhere, or refused when strict, never
#    silently moved; with placement forced ([pools.node.N] long_term_pins =
#    "allow", as an admin would), the pin really moves the pages, the
#    client's check reports the true node and the daemon's accounting follows;
#  - normal: the pages stay on the CXL node;
#  - mixed: the daemon moved the pages into the node's kernel zone before the
#    grant, so they stay; a lease too big for that zone goes elsewhere.
#
# Sourced by the host (bash) and the guest (busybox sh): POSIX sh only.
VM_CXL_MIB=512
. "$VM_DIR/cxl.sh"
TOPO_FAR_NODE=
VM_CXL_NODE=
# This topology runs its own daemons (three configurations); the generic
# daemon checks run on the same expander in cxl-ram.
TOPO_OWN_DAEMON_CHECKS=1
PIN_SOCK=/run/cxlpool/pin.sock
PIN_PID=

topo_host_prepare() { cxl_host_prepare "$1"; }
topo_qemu_args() { cxl_qemu_args "$1"; }

topo_guest_setup() {
  cxl_guest_make_devdax || return 1
  vm_check "daxctl reconfigure-device --mode=system-ram $VM_DAX_DEV (movable: the default)" \
    daxctl reconfigure-device --mode=system-ram --force "$VM_DAX_DEV"
  VM_CXL_NODE=$(cat /sys/bus/dax/devices/$VM_DAX_DEV/target_node)
  TOPO_FAR_NODE=$VM_CXL_NODE
}

# The CXL node's memory blocks, in address order.
pin_blocks() { ls -d /sys/devices/system/node/node$VM_CXL_NODE/memory[0-9]* 2>/dev/null | sort -V; }

# Every block of the CXL node onlined to zone $1 (the first word of valid_zones).
pin_all_blocks_in() {
  for _b in $(pin_blocks); do [ "$(cut -d' ' -f1 "$_b/valid_zones")" = "$1" ] || return 1; done
}

# Topology JSON of the CXL node: long_term_pins, kernel and movable bytes.
pin_json_zones() {  # label pins kernel_mib movable_mib
  cxlpoolctl topology --json >/out/topology-$1.json 2>>"$VM_LOG"
  _sel=".numa_nodes[] | select(.id == $VM_CXL_NODE)"
  vm_check_eq "json ($1): node $VM_CXL_NODE long_term_pins" \
    "$(jq -c "$_sel | .long_term_pins" /out/topology-$1.json)" "\"$2\""
  vm_check_eq "json ($1): node $VM_CXL_NODE kernel_zone_bytes" \
    "$(jq -c "$_sel | .kernel_zone_bytes" /out/topology-$1.json)" $(($3 << 20))
  vm_check_eq "json ($1): node $VM_CXL_NODE movable_bytes" \
    "$(jq -c "$_sel | .movable_bytes" /out/topology-$1.json)" $(($4 << 20))
}

pin_start_daemon() {  # label [extra config lines]
  _label=$1
  shift
  mkdir -p /run/cxlpool
  { printf '[pools]\n'; for _l in "$@"; do printf '%s\n' "$_l"; done; } \
    >/out/cxlpoold-$_label.toml
  cxlpoold --foreground --config /out/cxlpoold-$_label.toml --socket "$PIN_SOCK" \
    >/out/cxlpoold-$_label.log 2>&1 &
  PIN_PID=$!
  vm_check "cxlpoold ($_label) listens" vm_wait_for 240 test -S "$PIN_SOCK"
}

pin_stop_daemon() {
  [ -n "$PIN_PID" ] || return 0
  kill "$PIN_PID" 2>/dev/null
  wait "$PIN_PID"
  case $? in
    0 | 143) ;;
    *) vm_fail "cxlpoold exit status on SIGTERM (log: /out/cxlpoold-*.log)" ;;
  esac
  PIN_PID=
  rm -f "$PIN_SOCK"
}

pin_client() { cxlpool-vm-client pin --socket "$PIN_SOCK" "$@"; }

# The forced case: the pin moves the pages; while the lease is held, the
# daemon's own mapping, `pools` and `leases` must show the true node.
pin_forced_move() {
  [ -p /tmp/pin.fifo ] || mkfifo /tmp/pin.fifo
  exec 9<>/tmp/pin.fifo
  pin_client --size $((8 << 20)) --node "$VM_CXL_NODE" --strict --expect-moved-to 0 --hold \
    <&9 >/out/pin-forced.log 2>&1 &
  _c=$!
  if vm_check "forced: lease on CXL node $VM_CXL_NODE pinned; pages moved to node 0; verify says node 0" \
    vm_wait_for 240 grep -q '^READY' /out/pin-forced.log; then
    cat /out/pin-forced.log >>"$VM_LOG"
    vm_check "forced: the daemon's own mapping is on node 0 too (move_pages)" \
      cxlpool-vm-probe expect "$PIN_PID" 0
    cxlpoolctl pools --json --socket "$PIN_SOCK" >/out/pools-forced.json 2>>"$VM_LOG"
    vm_check_eq "forced: pool node$VM_CXL_NODE leased bytes after the move" \
      "$(jq -c ".[] | select(.name == \"node$VM_CXL_NODE\") | .leased_bytes" /out/pools-forced.json)" 0
    vm_check_eq "forced: pool node0 leased bytes after the move" \
      "$(jq -c '.[] | select(.name == "node0") | .leased_bytes' /out/pools-forced.json)" $((8 << 20))
    cxlpoolctl leases --json --socket "$PIN_SOCK" >/out/leases-forced.json 2>>"$VM_LOG"
    vm_check_eq "forced: cxlpoolctl leases: node now, node placed on" \
      "$(jq -c '[.[0].numa_node, .[0].placed_numa_node, .[0].long_term_pin]' /out/leases-forced.json)" \
      "[0,$VM_CXL_NODE,true]"
    cxlpoolctl metrics --socket "$PIN_SOCK" >/out/metrics-forced.txt 2>>"$VM_LOG"
    vm_check "forced: metric cxlpool_leases_moved_total 1" \
      grep -q '^cxlpool_leases_moved_total 1$' /out/metrics-forced.txt
  fi
  echo done >&9
  wait "$_c"
  vm_check_eq "forced: client exit status (pattern intact, release taken)" "$?" 0
  exec 9>&-
  cat /out/pin-forced.log >>"$VM_LOG"
}

topo_guest_checks() {
  if ! vm_have cxlpoold || ! vm_have cxlpoolctl || ! vm_have cxlpool-vm-client; then
    vm_skip "long-term pins on movable, normal and mixed CXL memory" "daemon or clients not built"
    return
  fi
  _N=$VM_CXL_NODE
  _nb=$(pin_blocks | wc -l)
  vm_check_eq "kernel: CXL node $_N has 3 memory blocks of 128 MiB" \
    "$_nb/$(cat /sys/devices/system/memory/block_size_bytes)" "3/8000000"

  # ---- movable (daxctl's default) ----
  vm_check "kernel: every block of node $_N online Movable" pin_all_blocks_in Movable
  pin_json_zones movable no 0 384
  vm_check "kernel: a long-term pin moves movable CXL pages to node 0 (the problem)" \
    sh -c "cxlpool-vm-probe pin $_N 8 >/out/probe-pin-movable.txt && cat /out/probe-pin-movable.txt &&
           grep -q '^PIN before N$_N:Movable=2048 unknown=0' /out/probe-pin-movable.txt &&
           grep '^PIN after' /out/probe-pin-movable.txt | grep -q ' N0:' &&
           ! grep '^PIN after' /out/probe-pin-movable.txt | grep -q ' N$_N:'"
  pin_start_daemon movable
  cxlpoolctl pools --json --socket "$PIN_SOCK" >/out/pools-movable.json 2>>"$VM_LOG"
  vm_check_eq "pools: node$_N long_term_pins" \
    "$(jq -c ".[] | select(.name == \"node$_N\") | .long_term_pins" /out/pools-movable.json)" '"no"'
  vm_check "movable: a pinned lease asking for tier cxl is placed on node 0; its pages stay there" \
    pin_client --size $((8 << 20)) --tier cxl --expect-node 0
  vm_check "movable: a strict pinned lease on node $_N is refused (EUNSUPPORTED: ZONE_MOVABLE, daxctl remedy)" \
    pin_client --size $((8 << 20)) --node "$_N" --strict --expect-refused
  vm_check "movable: without the pin the same strict request is granted on node $_N" \
    cxlpool-vm-client place --socket "$PIN_SOCK" --size $((4 << 20)) --node "$_N" --strict \
    --expect-node "$_N"
  pin_stop_daemon
  # The admin forces placement there: the pin then really moves the pages.
  pin_start_daemon forced "[pools.node.$_N]" 'long_term_pins = "allow"'
  pin_forced_move
  pin_stop_daemon

  # ---- mixed: the first block in ZONE_NORMAL, the others ZONE_MOVABLE ----
  vm_check "daxctl offline-memory $VM_DAX_DEV" daxctl offline-memory "$VM_DAX_DEV"
  _first=1
  _mixed=ok
  for _b in $(pin_blocks); do
    if [ $_first = 1 ]; then
      echo online_kernel >"$_b/state" || _mixed=fail
      _first=0
    else
      echo online_movable >"$_b/state" || _mixed=fail
    fi
  done
  vm_check_eq "kernel: node $_N onlined one block kernel, two movable" \
    "$_mixed $(for _b in $(pin_blocks); do cut -d' ' -f1 "$_b/valid_zones"; done | tr '\n' ' ')" \
    "ok Normal Movable Movable "
  pin_json_zones mixed partly 128 256
  vm_check "kernel: on a mixed node a pin moves pages into its own kernel zone (room permitting)" \
    sh -c "cxlpool-vm-probe pin $_N 8 >/out/probe-pin-mixed.txt && cat /out/probe-pin-mixed.txt &&
           grep -q '^PIN before N$_N:Movable=2048 unknown=0' /out/probe-pin-mixed.txt &&
           grep -q '^PIN after N$_N:Normal=2048 unknown=0' /out/probe-pin-mixed.txt"
  pin_start_daemon mixed
  [ -p /tmp/pin.fifo ] || mkfifo /tmp/pin.fifo
  exec 9<>/tmp/pin.fifo
  pin_client --size $((8 << 20)) --node "$_N" --strict --expect-node "$_N" --hold \
    <&9 >/out/pin-mixed.log 2>&1 &
  _c=$!
  if vm_check "mixed: a strict pinned lease on node $_N is granted; its pages stay through the pin" \
    vm_wait_for 240 grep -q '^READY' /out/pin-mixed.log; then
    vm_check "mixed: the daemon moved the lease into node $_N's kernel zone before the grant" \
      sh -c "cxlpool-vm-probe zones $PIN_PID >/out/probe-zones-mixed.txt && cat /out/probe-zones-mixed.txt &&
             grep -q '^SUMMARY N$_N:Normal=2048 unknown=0' /out/probe-zones-mixed.txt"
  fi
  echo done >&9
  wait "$_c"
  vm_check_eq "mixed: client exit status (every page on node $_N before and after)" "$?" 0
  vm_check "mixed: the placement reason says the pages were moved into the kernel zone" \
    grep -q "long-term pin: pages moved into node $_N's kernel zones before the grant" \
    /out/pin-mixed.log
  exec 9>&-
  cat /out/pin-mixed.log >>"$VM_LOG"
  vm_check "mixed: a strict pinned lease bigger than the kernel zone is refused, naming it" \
    sh -c "! pin_out=\$(cxlpool-vm-client pin --socket $PIN_SOCK --size $((160 << 20)) --node $_N --strict 2>&1) &&
           echo \"\$pin_out\" | tee -a $VM_LOG | grep -q \"node $_N's kernel zones have\""
  vm_check "mixed: the same lease without --strict is placed elsewhere (node 0), pages stay there" \
    pin_client --size $((160 << 20)) --node "$_N" --expect-node 0
  pin_stop_daemon

  # ---- normal: the two movable blocks onlined to the kernel zone too ----
  # (Last: memory onlined to a kernel zone takes the kernel's own unmovable
  # allocations, so it may never go offline again.)
  _mixed=ok
  for _b in $(pin_blocks); do
    [ "$(cut -d' ' -f1 "$_b/valid_zones")" = Movable ] || continue
    { echo offline >"$_b/state" && echo online_kernel >"$_b/state"; } || _mixed=fail
  done
  vm_check_eq "kernel: node $_N's movable blocks onlined again with online_kernel" "$_mixed" ok
  vm_check "kernel: every block of node $_N online Normal" pin_all_blocks_in Normal
  pin_json_zones normal yes 384 0
  pin_start_daemon normal
  vm_check "normal: a strict pinned lease on node $_N keeps every page there through the pin" \
    pin_client --size $((8 << 20)) --node "$_N" --strict --expect-node "$_N"
  pin_stop_daemon
  # A lease of five extents (daemon.max_extent = "2M"): every page of each
  # extent on the CXL node before and after the pin (move_pages per mapping).
  pin_start_daemon normal-extents '[daemon]' 'max_extent = "2M"'
  vm_check "normal: a strict pinned lease of 5 extents on node $_N keeps every page of each there" \
    pin_client --size $(((8 << 20) + 4096)) --node "$_N" --strict --expect-node "$_N" \
    --expect-extents 5
  pin_stop_daemon
}
