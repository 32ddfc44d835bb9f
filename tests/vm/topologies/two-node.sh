# Topology "two-node": node 0 holds both CPUs and 512 MiB; node 1 is a
# memory-only node (256 MiB) whose initiator is node 0. SLIT distance 28,
# HMAT latency/bandwidth for both targets (-machine hmat=on, QEMU 7.2).
#
# Sourced twice: by the host script (topo_host_prepare, topo_qemu_args, in
# bash) and by the guest init (topo_guest_*, in busybox sh), so it is POSIX sh.
TOPO_NODES=2
TOPO_FAR_NODE=1

topo_host_prepare() { :; }

# One QEMU argument per line.
topo_qemu_args() {
  cat <<'ARGS'
-machine
q35,hmat=on
-smp
2,sockets=1,cores=2
-m
768M
-object
memory-backend-ram,id=m0,size=512M
-object
memory-backend-ram,id=m1,size=256M
-numa
node,nodeid=0,memdev=m0,cpus=0-1,initiator=0
-numa
node,nodeid=1,memdev=m1,initiator=0
-numa
dist,src=0,dst=1,val=28
-numa
hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-latency,latency=10
-numa
hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-bandwidth,bandwidth=20G
-numa
hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-latency,latency=30
-numa
hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-bandwidth,bandwidth=5G
ARGS
}

topo_guest_setup() { :; }

# The testbed itself: the kernel must see what QEMU was told.
topo_guest_checks() {
  _n=/sys/devices/system/node
  vm_check_eq "kernel: online nodes" "$(cat $_n/online)" "0-1"
  vm_check_eq "kernel: node1 cpus" "$(cat $_n/node1/cpulist)" ""
  vm_check_eq "kernel: SLIT row of node0" "$(cat $_n/node0/distance)" "10 28"
  vm_check_eq "kernel: HMAT node1 read latency (ns)" \
    "$(cat $_n/node1/access0/initiators/read_latency 2>/dev/null)" "30"
  vm_check_eq "kernel: HMAT node1 read bandwidth (MB/s)" \
    "$(cat $_n/node1/access0/initiators/read_bandwidth 2>/dev/null)" "5120"
  vm_check_eq "kernel: node1 initiator" "$(ls $_n/node1/access0/initiators | grep '^node')" "node0"
  vm_check "kernel: 8 MiB mbind'ed to node1 lands there and reads back" cxlpool-vm-probe bind 1 8
  # Node 1 has nothing behind it that sysfs shows: memory of unknown kind.
  vm_unknown_node_not_pooled 1
}
