# Topology "four-node": nodes 0 and 1 each hold one CPU (two sockets); nodes 2
# and 3 are memory-only, attached to node 0 and node 1 respectively. Full
# SLIT matrix and a full HMAT latency/bandwidth matrix from both initiators.
#
# Sourced by the host (bash) and the guest (busybox sh): POSIX sh only.
TOPO_NODES=4
TOPO_FAR_NODE=3

topo_host_prepare() { :; }

topo_qemu_args() {
  cat <<'ARGS'
-machine
q35,hmat=on
-smp
2,sockets=2,cores=1
-m
1280M
-object
memory-backend-ram,id=m0,size=384M
-object
memory-backend-ram,id=m1,size=384M
-object
memory-backend-ram,id=m2,size=256M
-object
memory-backend-ram,id=m3,size=256M
-numa
node,nodeid=0,memdev=m0,cpus=0,initiator=0
-numa
node,nodeid=1,memdev=m1,cpus=1,initiator=1
-numa
node,nodeid=2,memdev=m2,initiator=0
-numa
node,nodeid=3,memdev=m3,initiator=1
-numa
dist,src=0,dst=1,val=21
-numa
dist,src=0,dst=2,val=24
-numa
dist,src=0,dst=3,val=32
-numa
dist,src=1,dst=2,val=32
-numa
dist,src=1,dst=3,val=24
-numa
dist,src=2,dst=3,val=40
ARGS
  # initiator target latency(ns) bandwidth
  while read -r i t lat bw; do
    printf -- '-numa\nhmat-lb,initiator=%s,target=%s,hierarchy=memory,data-type=access-latency,latency=%s\n' "$i" "$t" "$lat"
    printf -- '-numa\nhmat-lb,initiator=%s,target=%s,hierarchy=memory,data-type=access-bandwidth,bandwidth=%s\n' "$i" "$t" "$bw"
  done <<'HMAT'
0 0 10 20G
0 1 25 10G
0 2 20 8G
0 3 45 3G
1 0 25 10G
1 1 10 20G
1 2 45 3G
1 3 20 8G
HMAT
}

topo_guest_setup() { :; }

topo_guest_checks() {
  _n=/sys/devices/system/node
  vm_check_eq "kernel: online nodes" "$(cat $_n/online)" "0-3"
  vm_check_eq "kernel: nodes with cpus" "$(cat $_n/has_cpu)" "0-1"
  vm_check_eq "kernel: SLIT row of node2" "$(cat $_n/node2/distance)" "24 32 10 40"
  vm_check_eq "kernel: node2 initiator" "$(ls $_n/node2/access0/initiators | grep '^node')" "node0"
  vm_check_eq "kernel: node3 initiator" "$(ls $_n/node3/access0/initiators | grep '^node')" "node1"
  vm_check_eq "kernel: HMAT node3 read latency (ns)" \
    "$(cat $_n/node3/access0/initiators/read_latency 2>/dev/null)" "20"
  vm_check_eq "kernel: HMAT node3 read bandwidth (MB/s)" \
    "$(cat $_n/node3/access0/initiators/read_bandwidth 2>/dev/null)" "8192"
  vm_check "kernel: 8 MiB mbind'ed to node2 lands there and reads back" cxlpool-vm-probe bind 2 8
  vm_check "kernel: 8 MiB mbind'ed to node3 lands there and reads back" cxlpool-vm-probe bind 3 8
}
