# Topology "shared-pair": one of two guests booted together by
# run-pair-vm.sh. Both map one memory-backend file of the host (share=on) as
# an NVDIMM (famfs's recipe), make it devdax and run a daemon that shares it
# as a [[cluster.shared]] device, in one etcd cluster on the host's loopback
# (QEMU user networking: the guest dials 10.0.2.2, QEMU connects to
# 127.0.0.1). An NVDIMM rather than the CXL type-3 device of cxl-devdax: QEMU
# 7.2 serves CXL memory at a few MB/s under TCG, and a second guest would
# have to rebuild the CXL region from a shared label area.
#
# Kernel command line: cxlpool.role=a|b, cxlpool.etcd=IP:PORT[,IP:PORT...].
# The guests meet through keys of their own in etcd (pair_put/pair_wait):
#   a: formats the device (ndctl), starts its daemon with the device's id
#      (the daemon writes the header), leases 2 slices, tags them, publishes
#      their offsets (a/leases);
#   b: waits for a/leases, then loads the NVDIMM stack: its kernel finds the
#      devdax info block a wrote. Its daemon has no id configured and must
#      read "vm-pair" from the header. Leases 2 slices, tags them, publishes
#      b/leases.
#   a: its slices are its own in etcd and disjoint from b's; its tags are
#      intact after b wrote; releases, stops its daemon (unused slices go
#      back), publishes a/done.
#   b: its tags are intact; releases; takes every slice of the device: each
#      reads zero, a's old ones included.
# Offsets are published and compared as device offsets: slice i of the
# device starts at 2 MiB (the header) + i x the slice size.
#
# Sourced by the guest (busybox sh): POSIX sh only.
TOPO_FAR_NODE=
VM_PAIR_ID=vm-pair
VM_PAIR_SLICE_MIB=16
VM_PAIR_KEYS=/cxlpool-vm-pair
VM_PAIR_ROLE=
VM_PAIR_EPS=
for _arg in $(cat /proc/cmdline); do
  case $_arg in
    cxlpool.role=*) VM_PAIR_ROLE=${_arg#cxlpool.role=} ;;
    cxlpool.etcd=*) VM_PAIR_EPS=${_arg#cxlpool.etcd=} ;;
  esac
done
VM_PAIR_HOST=guest-$VM_PAIR_ROLE
VM_PAIR_OTHER=a
[ "$VM_PAIR_ROLE" = a ] && VM_PAIR_OTHER=b

pair_etcdctl() {
  ETCDCTL_API=3 etcdctl --endpoints="$VM_PAIR_EPS" --cacert /vm/etcd/ca.crt \
    --cert /vm/etcd/client.crt --key /vm/etcd/client.key \
    --dial-timeout=5s --command-timeout=10s "$@"
}
pair_put() { pair_etcdctl put "$VM_PAIR_KEYS/$1" "$2" >/dev/null; }
pair_get() { pair_etcdctl get --print-value-only "$VM_PAIR_KEYS/$1" 2>/dev/null; }
pair_has() { [ -n "$(pair_get "$1")" ]; }
# Waits (bounded) for KEY; gives up at once when the other guest failed.
pair_wait() {  # key tries
  vm_wait_for "$2" pair_has_or_failed "$1"
  pair_has "$1"
}
pair_has_or_failed() { pair_has "$1" || pair_has "$VM_PAIR_OTHER/failed"; }

# "index owner" per slice key of the device, read from etcd itself.
pair_slice_owners() {
  pair_etcdctl get --prefix "/cxlpool/v1/slices/$VM_PAIR_ID/" -w json |
    jq -r '.kvs[]? | "\(.key | @base64d | split("/") | last | tonumber) \(.value | @base64d | fromjson | .owner)"'
}
pair_index() { echo $((($1 - 2097152) / (VM_PAIR_SLICE_MIB << 20))); }

# Each offset in the list is a slice etcd records as owned by HOST.
pair_owned_by() {  # host offsets...
  _h=$1
  shift
  pair_slice_owners >/tmp/owners || return 1
  cat /tmp/owners
  for _o in "$@"; do
    _i=$(pair_index "$_o")
    grep -qx "$_i $_h" /tmp/owners || { echo "slice $_i (offset $_o) is not $_h's"; return 1; }
  done
}

pair_owns_none() { pair_slice_owners >/tmp/owners && ! grep -q " $1\$" /tmp/owners; }

pair_disjoint() {  # "list1" "list2"
  for _o in $1; do
    case " $2 " in *" $_o "*) echo "offset $_o in both"; return 1 ;; esac
  done
}

pair_net_up() {
  vm_check "modprobe virtio_net" modprobe virtio_net || return 1
  vm_check "kernel: eth0 appears" vm_wait_for 60 test -e /sys/class/net/eth0 || return 1
  ip link set lo up
  ip link set eth0 up
  ip addr add 10.0.2.15/24 dev eth0
  ip route add default via 10.0.2.2
  vm_check "etcd answers at $VM_PAIR_EPS (QEMU user net to the host's loopback, TLS)" \
    vm_wait_for 60 pair_etcdctl get /
}

pair_devdax() {
  vm_check "modprobe NVDIMM/DAX stack" modprobe -a nfit libnvdimm nd_pmem dax_pmem device_dax ||
    return 1
  vm_check "kernel: NVDIMM namespace0.0 appears" \
    vm_wait_for 120 test -e /sys/bus/nd/devices/namespace0.0 || return 1
  if [ "$VM_PAIR_ROLE" = a ]; then
    ndctl create-namespace -f -e namespace0.0 -m devdax -a 2M >/out/create-namespace.json 2>>"$VM_LOG"
    vm_check_eq "ndctl create-namespace -m devdax (exit)" "$?" 0 || return 1
  fi
  vm_check "kernel: a devdax device on the shared memory" \
    vm_wait_for 120 sh -c 'ls /sys/bus/dax/devices | grep -q .' || return 1
  VM_DAX_DEV=$(ls /sys/bus/dax/devices | head -n 1)
  vm_check "kernel: /dev/$VM_DAX_DEV is a character device" test -c "/dev/$VM_DAX_DEV"
}

pair_config() {
  _eps=$(echo "$VM_PAIR_EPS" | sed 's/[^,]*/"&"/g; s/,/, /g')
  cat <<CONF
[daemon]
state_dir = "/run/cxlpool/state"

[pools]

[cluster]
endpoints = [$_eps]
host = "$VM_PAIR_HOST"
session_ttl = "10s"
publish_interval = "500ms"
ca = "/vm/etcd/ca.crt"
cert = "/vm/etcd/client.crt"
key = "/vm/etcd/client.key"

[[cluster.shared]]
path = "/dev/$VM_DAX_DEV"
slice_size = "${VM_PAIR_SLICE_MIB}M"
claim_ahead = 1
idle_release = "2s"
CONF
  # Only a names the device: b learns its id from the header a's daemon wrote.
  [ "$VM_PAIR_ROLE" = a ] && echo "id = \"$VM_PAIR_ID\""
}

pair_start_daemon() {
  mkdir -p /run/cxlpool
  pair_config >/out/cxlpoold.toml
  cxlpoold --foreground --config /out/cxlpoold.toml --socket "$VM_SOCK" >/out/cxlpoold.log 2>&1 &
  VM_DAEMON_PID=$!
  vm_check "cxlpoold starts and listens on $VM_SOCK" vm_wait_for 240 test -S "$VM_SOCK"
}

# The device ids host HOST's record lists.
pair_record_ids() {
  cxlpoolctl cluster --json --config /out/cxlpoold.toml 2>/dev/null |
    jq -r --arg h "$1" '.hosts[] | select(.host == $h) | .shared_devices[].id'
}
pair_record_has() { [ "$(pair_record_ids "$1")" = "$VM_PAIR_ID" ]; }

# Holds N tagged slices (fifo on fd 8); sets VM_PAIR_MINE to their offsets.
pair_hold() {
  rm -f /tmp/pair.in
  mkfifo /tmp/pair.in
  cxlpool-vm-shared hold --socket "$VM_SOCK" --tag "$VM_PAIR_HOST" --count 2 --wait-s 60 \
    </tmp/pair.in >/out/hold.out 2>&1 &
  VM_PAIR_HOLD=$!
  exec 8>/tmp/pair.in
  vm_check "$VM_PAIR_HOST holds 2 slices, zero when granted, tagged" \
    vm_wait_for 240 grep -q READY /out/hold.out || return 1
  VM_PAIR_MINE=$(grep '^SLICE ' /out/hold.out | cut -d' ' -f2 | sort -n | tr '\n' ' ' | sed 's/ $//')
  vm_note "$VM_PAIR_HOST's slices at device offsets: $VM_PAIR_MINE"
  echo "$VM_PAIR_MINE" >/out/slices-held
  # shellcheck disable=SC2086
  vm_check "etcd: the slices under $VM_PAIR_HOST's leases are $VM_PAIR_HOST's" \
    pair_owned_by "$VM_PAIR_HOST" $VM_PAIR_MINE
}

pair_check_tags() {
  echo check >&8
  vm_check "$VM_PAIR_HOST's tags intact after $1" vm_wait_for 120 grep -q '^CHECK ok' /out/hold.out
}

pair_release() {
  echo release >&8
  exec 8>&-
  wait "$VM_PAIR_HOLD"
  vm_check_eq "$VM_PAIR_HOST's holder released its slices ($(tail -n 1 /out/hold.out))" "$?" 0
}

pair_common_start() {
  pair_net_up || return 1
  if [ "$VM_PAIR_ROLE" = b ]; then
    vm_check "a's slices are published (a formatted the device and leased)" pair_wait a/leases 600 ||
      return 1
  fi
  pair_devdax || return 1
  pair_start_daemon || return 1
  vm_check "$VM_PAIR_HOST's record lists device $VM_PAIR_ID (the header's id)" \
    vm_wait_for 240 pair_record_has "$VM_PAIR_HOST" || return 1
  pair_hold || return 1
  pair_put "$VM_PAIR_ROLE/leases" "$VM_PAIR_MINE"
}

pair_main_a() {
  vm_check "b's slices are published" pair_wait b/leases 600 || return 1
  _theirs=$(pair_get b/leases)
  vm_check "a's and b's slices are disjoint ($VM_PAIR_MINE | $_theirs)" \
    pair_disjoint "$VM_PAIR_MINE" "$_theirs"
  vm_check "etcd: b's slices are b's" pair_owned_by guest-b $_theirs
  pair_check_tags "b wrote its own"
  pair_release
  vm_stop_daemon
  vm_check "etcd: a owns no slice after its clean exit" vm_wait_for 20 pair_owns_none guest-a
  pair_put a/done 1
}

pair_main_b() {
  _theirs=$(pair_get a/leases)
  vm_check "a's and b's slices are disjoint ($_theirs | $VM_PAIR_MINE)" \
    pair_disjoint "$_theirs" "$VM_PAIR_MINE"
  vm_check "a's record lists the same device id" pair_record_has guest-a
  vm_check "a is done (its tags held, it left)" pair_wait a/done 600 || return 1
  pair_check_tags "a wrote its own"
  pair_release
  cxlpool-vm-shared fill --socket "$VM_SOCK" --tag guest-b-fill --wait-s 15 >/out/fill.out 2>&1
  vm_check_eq "b takes every free slice, each zero when granted ($(tail -n 1 /out/fill.out))" "$?" 0
  _filled=$(grep '^SLICE ' /out/fill.out | cut -d' ' -f2 | sort -n | tr '\n' ' ')
  echo "$_filled" >/out/slices-filled
  vm_note "b's fill took the slices at: $_filled"
  _total=$(cxlpoolctl cluster --json --config /out/cxlpoold.toml |
    jq -r --arg d "$VM_PAIR_ID" '.shared_devices[] | select(.id == $d) | .slices')
  # shellcheck disable=SC2086
  set -- $_filled
  vm_check_eq "b's fill took every slice of the device" "$#" "$_total"
  for _o in $_theirs; do
    vm_check "a's slice at $_o went to b and read zero" sh -c "echo ' $_filled' | grep -q ' $_o '"
  done
  vm_stop_daemon
}

topo_main() {
  vm_note "shared-pair: guest $VM_PAIR_ROLE ($VM_PAIR_HOST), etcd $VM_PAIR_EPS"
  case $VM_PAIR_ROLE in
    a | b) ;;
    *) vm_fail "cxlpool.role=a|b on the kernel command line (got '$VM_PAIR_ROLE')"; return ;;
  esac
  if pair_common_start; then
    "pair_main_$VM_PAIR_ROLE"
  fi
  [ "$VM_FAILED" -eq 0 ] || pair_put "$VM_PAIR_ROLE/failed" 1
  [ -n "$VM_DAEMON_PID" ] && vm_stop_daemon
}
