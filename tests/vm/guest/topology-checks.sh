# Guest side (busybox sh): `cxlpoolctl topology --json` against what the
# kernel shows (sysfs, numactl -H). Every fact is its own check, so a failure
# names the field. The kernel's view is also saved to /out for the host.
VM_SYS_NODE=/sys/devices/system/node
VM_JSON=/out/topology.json

vm_save_kernel_view() {
  numactl -H >/out/numactl-H.txt 2>&1
  cat /proc/meminfo >/out/meminfo.txt
  cat /proc/zoneinfo >/out/zoneinfo.txt 2>/dev/null
  if [ -d /sys/bus/cxl/devices ]; then
    cxl list -vvv >/out/cxl-list.json 2>&1
    daxctl list -R -D -M >/out/daxctl-list.json 2>&1
    ndctl list -R -N >/out/ndctl-list.json 2>&1
  fi
}

# jq against the JSON; prints "null" for anything absent.
vm_j() { jq -c "$1" "$VM_JSON" 2>/dev/null; }
vm_jn() { vm_j ".numa_nodes[] | select(.id == $1) | $2"; }

# "nodeX nodeY" entries of a directory -> "[X,Y]"
vm_node_links() {
  vm_json_ints "$(ls "$1" 2>/dev/null | sed -n 's/^node\([0-9]*\)$/\1/p' | sort -n | tr '\n' ' ')"
}

# Node facts from the kernel, as one flat JSON object; one jq run projects
# the same keys out of cxlpoolctl's JSON and prints "key<TAB>got<TAB>want"
# lines (jq starts slowly under TCG, so not one run per field).
VM_NODE_PROJECTION='
  (.numa_nodes[] | select(.id == $id)) as $n
  | ({cpus: $n.cpus, memory_bytes: $n.memory_bytes,
      distance_nodes: [$n.distances | keys[] | tonumber] | sort,
      distances: [$n.distances | to_entries | sort_by(.key | tonumber)[] | .value],
      memory_tier: $n.memory_tier}
     + ([$n.access[] as $a | $a | del(.class) | to_entries[]
         | {key: "access\($a.class).\(.key)", value: .value}] | from_entries)
     + (reduce $n.access[] as $a ({}; . + {"access\($a.class)": "present"}))) as $got
  | $want | keys_unsorted[] | "\(.)\t\($got[.] | tojson)\t\($want[.] | tojson)"'

vm_check_node() {
  _id=$1
  _d=$VM_SYS_NODE/node$_id
  if [ "$(vm_j "[.numa_nodes[] | select(.id == $_id)] | length")" != 1 ]; then
    vm_fail "json: node $_id listed once"
    return
  fi
  _kb=$(awk '/MemTotal:/ { print $4 }' "$_d/meminfo")
  # Memory tier (memory_tiering/memory_tierN/nodelist).
  _tier=null
  for _t in /sys/devices/virtual/memory_tiering/memory_tier*; do
    [ -f "$_t/nodelist" ] || continue
    for _m in $(vm_expand_list "$(cat "$_t/nodelist")"); do
      [ "$_m" = "$_id" ] && _tier=${_t##*memory_tier}
    done
  done
  # SLIT: the distance row is in online-node order.
  _want="{\"cpus\":$(vm_json_ints "$(vm_expand_list "$(cat "$_d/cpulist")")")"
  _want="$_want,\"memory_bytes\":$((_kb * 1024)),\"memory_tier\":$_tier"
  _want="$_want,\"distance_nodes\":$(vm_json_ints "$(vm_nodes_in $VM_SYS_NODE/online)")"
  _want="$_want,\"distances\":$(vm_json_ints "$(cat "$_d/distance")")"
  # HMAT access classes 0 (any initiator) and 1 (CPU initiators).
  for _c in 0 1; do
    _a=$_d/access$_c/initiators
    if [ ! -d "$_a" ]; then
      _want="$_want,\"access$_c\":null"
      continue
    fi
    _want="$_want,\"access$_c.initiators\":$(vm_node_links "$_a")"
    for _f in read_bandwidth write_bandwidth read_latency write_latency; do
      _u=mbps
      case $_f in *latency) _u=ns ;; esac
      _k=null
      [ -f "$_a/$_f" ] && _k=$(cat "$_a/$_f")
      _want="$_want,\"access$_c.${_f}_$_u\":$_k"
    done
  done
  _want="$_want}"
  if ! jq -r --argjson id "$_id" --argjson want "$_want" "$VM_NODE_PROJECTION" "$VM_JSON" \
    >/tmp/.vm_cmp 2>>"$VM_LOG"; then
    vm_fail "json: node$_id fields could be compared (jq failed; want $_want)"
    return
  fi
  _tab=$(printf '\t')
  while IFS=$_tab read -r _k _g _w; do
    vm_check_eq "json: node$_id $_k" "$_g" "$_w"
  done </tmp/.vm_cmp
}

vm_check_numactl() {
  # "node N size: X MB" must match memory_bytes >> 20, and the distance table
  # must match the JSON distances.
  for _id in $(vm_nodes_in $VM_SYS_NODE/online); do
    _mb=$(sed -n "s/^node $_id size: \([0-9]*\) MB$/\1/p" /out/numactl-H.txt)
    _jb=$(vm_jn "$_id" .memory_bytes)
    case $_jb in '' | null) _jb=0 ;; esac
    vm_check_eq "numactl: node$_id size (MB)" "$((_jb / 1048576))" "$_mb"
  done
  _table=$(awk '/^node distances:/ { t = 1; next } t && /^ *[0-9]+:/ { sub(":", ""); print }' \
    /out/numactl-H.txt | tr -s ' ' | sed 's/^ //; s/ $//')
  _json=$(jq -r '.numa_nodes | sort_by(.id)[] | "\(.id) " + ([.distances | to_entries |
      sort_by(.key | tonumber)[] | .value | tostring] | join(" "))' "$VM_JSON" 2>/dev/null)
  vm_check_eq "numactl: distance table" "$(echo "$_json" | tr '\n' ';')" \
    "$(echo "$_table" | tr '\n' ';')"
}

vm_check_dax() {
  for _p in /sys/bus/dax/devices/dax*; do
    [ -e "$_p" ] || continue
    _name=${_p##*/}
    _sel=".dax_devices[] | select(.name == \"$_name\")"
    if [ -z "$(vm_j "$_sel | .name")" ]; then
      vm_fail "json: dax device $_name listed"
      continue
    fi
    vm_check_eq "json: $_name size_bytes" "$(vm_j "$_sel | .size_bytes")" "$(cat "$_p/size")"
    vm_check_eq "json: $_name target_node" "$(vm_j "$_sel | .target_node")" \
      "$(cat "$_p/target_node" 2>/dev/null || echo null)"
    _drv=$(basename "$(readlink "$_p/driver" 2>/dev/null)")
    case $_drv in
      kmem) _mode='"system-ram"' ;;
      device_dax) _mode='"devdax"' ;;
      *) _mode=null ;;
    esac
    vm_check_eq "json: $_name mode" "$(vm_j "$_sel | .mode")" "$_mode"
    case $(readlink -f "$_p") in
      */region[0-9]*/dax_region/* | */cxl* | */ndbus*)
        # pmem-backed CXL region (Debian 12) or an NVDIMM: source is cxl when a
        # CXL region is on the path.
        case $(readlink -f "$_p") in *ACPI0017*) _src='"cxl"' ;; *) _src='"nvdimm"' ;; esac
        vm_check_eq "json: $_name source" "$(vm_j "$_sel | .source")" "$_src"
        ;;
    esac
  done
}

vm_check_cxl() {
  for _p in /sys/bus/cxl/devices/mem*; do
    [ -e "$_p" ] || continue
    _name=${_p##*/}
    _sel=".cxl.memdevs[] | select(.name == \"$_name\")"
    if [ -z "$(vm_j "$_sel | .name")" ]; then
      vm_fail "json: cxl memdev $_name listed"
      continue
    fi
    vm_check_eq "json: $_name serial" "$(vm_j "$_sel | .serial")" "$(vm_dec "$(cat "$_p/serial")")"
    vm_check_eq "json: $_name ram_bytes" "$(vm_j "$_sel | .ram_bytes")" "$(vm_dec "$(cat "$_p/ram/size")")"
    vm_check_eq "json: $_name pmem_bytes" "$(vm_j "$_sel | .pmem_bytes")" \
      "$(vm_dec "$(cat "$_p/pmem/size")")"
  done
  for _p in /sys/bus/cxl/devices/region*; do
    [ -e "$_p" ] || continue
    _name=${_p##*/}
    _sel=".cxl.regions[] | select(.name == \"$_name\")"
    if [ -z "$(vm_j "$_sel | .name")" ]; then
      vm_fail "json: cxl region $_name listed"
      continue
    fi
    vm_check_eq "json: $_name size_bytes" "$(vm_j "$_sel | .size_bytes")" "$(vm_dec "$(cat "$_p/size")")"
    # Member memdevs: targetN names an endpoint decoder below the memdev.
    _mems=""
    for _t in "$_p"/target[0-9]*; do
      _dec=$(cat "$_t")
      [ -n "$_dec" ] || continue
      # decoderE.N sits under its endpoint port, whose uport is the memdev.
      _ep=$(dirname "$(readlink -f "/sys/bus/cxl/devices/$_dec")")
      _mem=$(basename "$(readlink -f "$_ep/uport")")
      _mems="$_mems $_mem"
    done
    vm_check_eq "json: $_name memdevs" "$(vm_j "[$_sel | .memdevs[]] | sort")" \
      "$(printf '%s\n' $_mems | jq -R . | jq -cs 'sort')"
    # Region -> DAX devices -> nodes, as the kernel links them.
    _daxs=""
    _nodes=""
    for _dx in /sys/bus/dax/devices/dax*; do
      [ -e "$_dx" ] || continue
      if vm_region_owns "$_name" "$_dx"; then
        _daxs="$_daxs ${_dx##*/}"
        if [ "$(basename "$(readlink "$_dx/driver" 2>/dev/null)")" = kmem ]; then
          _nodes="$_nodes $(cat "$_dx/target_node")"
        fi
      fi
    done
    vm_check_eq "json: $_name dax_devices" "$(vm_j "[$_sel | .dax_devices[]] | sort")" \
      "$(printf '%s\n' $_daxs | jq -R . | jq -cs 'map(select(. != "")) | sort')"
    vm_check_eq "json: $_name numa_nodes" "$(vm_j "[$_sel | .numa_nodes[]] | sort")" \
      "$(printf '%s\n' $_nodes | jq -cs 'sort')"
  done
}

# Does CXL region $1 back DAX device $2? On Debian 12's pmem path the DAX
# device sits under an nvdimm region (ndbusX/regionY/daxY.Z), not under the
# CXL region, so match by host physical address: the device's first mapping
# starts inside the CXL region's [resource, resource + size).
vm_region_owns() {
  _r=/sys/bus/cxl/devices/$1
  _start=$(cat "$2"/mapping0/start 2>/dev/null || cat "$2"/resource 2>/dev/null) || return 1
  _rs=$(cat "$_r/resource" 2>/dev/null) || return 1
  _rz=$(cat "$_r/size" 2>/dev/null) || return 1
  [ $((_start)) -ge $((_rs)) ] && [ $((_start)) -lt $((_rs + _rz)) ]
}

vm_check_tiers() {
  for _t in /sys/devices/virtual/memory_tiering/memory_tier*; do
    [ -f "$_t/nodelist" ] || continue
    _tid=${_t##*memory_tier}
    vm_check_eq "json: memory_tier $_tid nodes" \
      "$(vm_j "[.memory_tiers[] | select(.id == $_tid) | .nodes[]] | sort")" \
      "$(vm_json_ints "$(vm_expand_list "$(cat "$_t/nodelist")")")"
  done
}

vm_topology_checks() {
  if ! vm_have cxlpoolctl; then
    vm_skip "cxlpoolctl topology --json" "cxlpoolctl not built yet"
    return
  fi
  vm_check "cxlpoolctl topology --json exits 0" sh -c "cxlpoolctl topology --json >$VM_JSON"
  vm_check "topology JSON parses, schema_version 1" jq -e '.schema_version == 1' "$VM_JSON"
  cxlpoolctl topology >/out/topology.txt 2>&1
  vm_check_eq "json: node ids" "$(vm_j '[.numa_nodes[].id] | sort')" \
    "$(vm_json_ints "$(vm_nodes_in $VM_SYS_NODE/online)")"
  for _id in $(vm_nodes_in $VM_SYS_NODE/online); do
    vm_check_node "$_id"
  done
  vm_check_numactl
  vm_check_tiers
  vm_check_dax
  vm_check_cxl
  vm_check_eq "json: no GPUs in the guest" "$(vm_j '.gpus | length')" "0"
}
