# Guest side (busybox sh): check bookkeeping and small helpers shared by the
# topology files and the check scripts. Each check prints one line:
#   CXLPOOL-VM-CHECK ok|FAIL|skip NAME [details]
# which the host script shows. Counters live in this shell: never run a check
# inside a pipeline or $(...), or its count is lost.
VM_PASSED=0
VM_FAILED=0
VM_SKIPPED=0
VM_LOG=/out/log
mkdir -p /out
: >"$VM_LOG"

vm_note() {
  echo "CXLPOOL-VM-NOTE [$(cut -d' ' -f1 /proc/uptime)s] $*"
  echo "# $*" >>"$VM_LOG"
}
vm_pass() {
  VM_PASSED=$((VM_PASSED + 1))
  echo "CXLPOOL-VM-CHECK ok   $*"
  echo "ok $*" >>"$VM_LOG"
}
vm_fail() {
  VM_FAILED=$((VM_FAILED + 1))
  echo "CXLPOOL-VM-CHECK FAIL $*"
  echo "FAIL $*" >>"$VM_LOG"
}
# vm_skip NAME REASON: not run, and not counted as passed.
vm_skip() {
  VM_SKIPPED=$((VM_SKIPPED + 1))
  echo "CXLPOOL-VM-CHECK skip $1 ($2)"
  echo "skip $1 ($2)" >>"$VM_LOG"
}

# vm_check NAME CMD [ARG...]: passes when CMD exits 0. Output goes to the log;
# on failure its last lines are shown on the console too.
vm_check() {
  _name=$1
  shift
  echo "\$ $*" >>"$VM_LOG"
  "$@" >/tmp/.vm_check.out 2>&1
  _rc=$?
  if [ "$_rc" -eq 0 ]; then
    cat /tmp/.vm_check.out >>"$VM_LOG"
    vm_pass "$_name"
    return 0
  fi
  cat /tmp/.vm_check.out >>"$VM_LOG"
  vm_fail "$_name (exit $_rc: $(tail -n 3 /tmp/.vm_check.out | tr '\n' ' '))"
  return 1
}

# vm_check_eq NAME GOT WANT
vm_check_eq() {
  if [ "$2" = "$3" ]; then
    vm_pass "$1 = $3"
    return 0
  fi
  vm_fail "$1: got '$2', want '$3'"
  return 1
}

vm_result() {
  _status=pass
  [ "$VM_FAILED" -eq 0 ] && [ "$VM_PASSED" -gt 0 ] || _status=fail
  echo "CXLPOOL-VM-RESULT topology=$VM_TOPOLOGY status=$_status passed=$VM_PASSED failed=$VM_FAILED skipped=$VM_SKIPPED"
  echo "RESULT status=$_status passed=$VM_PASSED failed=$VM_FAILED skipped=$VM_SKIPPED" >>"$VM_LOG"
}

vm_have() { command -v "$1" >/dev/null 2>&1; }

# "0-2,5" -> "0 1 2 5"
vm_expand_list() {
  echo "$1" | tr ',' '\n' | while IFS=- read -r _a _b; do
    [ -z "$_a" ] && continue
    [ -z "$_b" ] && _b=$_a
    seq "$_a" "$_b"
  done | tr '\n' ' ' | sed 's/ $//'
}

# "0 1 5" -> "[0,1,5]"
vm_json_ints() {
  _s=$(echo "$1" | tr -s ' ' | sed 's/^ //; s/ $//; s/ /,/g')
  echo "[$_s]"
}

# Node ids (sorted) that sysfs lists in FILE (e.g. .../node/has_memory).
vm_nodes_in() { vm_expand_list "$(cat "$1" 2>/dev/null)"; }

# Hex or decimal -> decimal (busybox printf understands 0x).
vm_dec() { printf '%d' "$1" 2>/dev/null || echo "$1"; }

# Kernel's node for a memory-only node with the given size (first match).
vm_cpuless_nodes() {
  for _n in $(vm_nodes_in /sys/devices/system/node/has_memory); do
    [ -z "$(cat /sys/devices/system/node/node$_n/cpulist)" ] && printf '%s ' "$_n"
  done
  echo
}
