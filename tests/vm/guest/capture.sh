# Guest side (busybox sh): copy the sysfs/procfs files cxlpool's topology code
# and hwloc read into a plain tree (DEST/sys/..., DEST/proc/...), so the fast
# fake-root tests run on real kernel output. Attribute files are copied with
# cat (sysfs reports every file as 4096 bytes, so tar cannot read them);
# symlinks are recreated with their link text; unreadable (write-only) files
# are left out. The host saves the tree with --capture to
# tests/topology/fixtures/vm-<topology>/root/.

vm_cap_one() {  # machine path -> DEST
  _p=$1
  if [ -L "$_p" ]; then
    mkdir -p "$VM_CAP${_p%/*}"
    ln -sfn "$(readlink "$_p")" "$VM_CAP$_p"
  elif [ -d "$_p" ]; then
    mkdir -p "$VM_CAP$_p"
  elif [ -f "$_p" ]; then
    mkdir -p "$VM_CAP${_p%/*}"
    cat "$_p" >"$VM_CAP$_p" 2>/dev/null || rm -f "$VM_CAP$_p"
  fi
}

# Whole subtree, not following symlinks (they are copied as links).
vm_cap_tree() {
  [ -e "$1" ] || return 0
  find "$1" 2>/dev/null | while read -r _q; do
    case $_q in
      # Binary or side-effecting attributes, and per-CPU noise hwloc ignores.
      */config | */rom | */resource[0-9]* | */remove | */rescan | */reset | */uevent) continue ;;
      */power | */power/* | */cpuidle | */cpuidle/* | */cpufreq/* | */microcode/* | */trace/*) continue ;;
    esac
    vm_cap_one "$_q"
  done
}

# A bus's device links, and each device's canonical directory.
vm_cap_bus() {
  for _l in /sys/bus/"$1"/devices/*; do
    [ -e "$_l" ] || [ -L "$_l" ] || continue
    vm_cap_one "$_l"
    _c=$(readlink -f "$_l")
    if [ "$2" = deep ]; then
      vm_cap_tree "$_c"
    else
      for _f in "$_c"/*; do
        [ -f "$_f" ] && [ ! -L "$_f" ] && case ${_f##*/} in
          config | rom | resource* | remove | rescan | reset) ;;
          *) vm_cap_one "$_f" ;;
        esac
      done
    fi
    # Ancestors' small attributes (numa_node, local_cpulist of the PCI parent).
    _up=${_c%/*}
    for _f in numa_node local_cpulist vendor device class; do
      [ -f "$_up/$_f" ] && vm_cap_one "$_up/$_f"
    done
  done
}

vm_capture_sysfs() {
  VM_CAP=$1
  rm -rf "$VM_CAP"
  mkdir -p "$VM_CAP"
  vm_cap_tree /sys/devices/system/node
  vm_cap_tree /sys/devices/system/memory
  vm_cap_tree /sys/devices/system/cpu
  vm_cap_tree /sys/devices/virtual/memory_tiering
  vm_cap_tree /sys/kernel/mm/hugepages
  vm_cap_tree /sys/kernel/mm/transparent_hugepage
  vm_cap_bus pci shallow
  for _bus in cxl dax nd; do
    [ -d /sys/bus/$_bus ] && vm_cap_bus $_bus deep
  done
  for _f in meminfo cpuinfo zoneinfo buddyinfo; do
    vm_cap_one /proc/$_f
  done
  uname -r >/out/kernel-release
  _n=$(find "$VM_CAP" | wc -l)
  vm_note "sysfs capture: $_n entries"
}
