# shellcheck shell=bash
# Host side, shared by run-vm-tests.sh and run-systemd-vm.sh: run one guest
# and judge what it printed.
#
#   vm_qemu_run DIR TIMEOUT SHELL VERBOSE QEMU-ARGV...
#     writes DIR/qemu-cmdline, runs QEMU with its serial console in
#     DIR/console.log (SHELL=1: on the terminal, no timeout; VERBOSE=1: also
#     streamed), leaves DIR/console.txt (no CRs) and sets VM_QEMU_RC: 200
#     when the guest printed its result line but did not power off within
#     $VM_POWEROFF_GRACE seconds (default 90) and was stopped.
#
#   vm_verdict NAME DIR TIMEOUT SHELL
#     prints the guest's CXLPOOL-VM-CHECK lines, sets VM_RESULT (its
#     CXLPOOL-VM-RESULT line), VM_STATUS (pass|fail) and VM_WHY; on a failure
#     shows the last console lines. A guest passes only with status=pass,
#     failed=0 and at least one check passed.

vm_qemu_run() {
  local dir=$1 timeout_s=$2 shell=$3 verbose=$4
  shift 4
  printf '%q ' "$@" >"$dir/qemu-cmdline"
  echo >>"$dir/qemu-cmdline"
  if ((shell)); then
    "$@" -chardev "stdio,id=con,mux=on,signal=off,logfile=$dir/console.log" \
      -serial chardev:con -mon chardev=con
    VM_QEMU_RC=$?
  elif ((verbose)); then
    timeout -k 10 "$timeout_s" "$@" -serial stdio </dev/null 2>&1 | tee "$dir/console.log"
    VM_QEMU_RC=${PIPESTATUS[0]}
  else
    timeout -k 10 "$timeout_s" "$@" -chardev "file,id=con,path=$dir/console.log" \
      -serial chardev:con </dev/null >"$dir/qemu.log" 2>&1 &
    local qpid=$! result_at=0 stopped=0 grace=${VM_POWEROFF_GRACE:-90}
    # A guest that printed its result and then does not power off within
    # `grace` seconds is stopped: its checks are over, only the result disk
    # is left (QEMU's virtio-blk can hang on it; see guest/init).
    while kill -0 "$qpid" 2>/dev/null; do
      if ((result_at == 0)) && grep -aq 'CXLPOOL-VM-RESULT topology=' "$dir/console.log" 2>/dev/null; then
        result_at=$SECONDS
      fi
      if ((result_at > 0 && SECONDS - result_at > grace)); then
        kill -TERM "$qpid" 2>/dev/null
        wait "$qpid" 2>/dev/null
        stopped=1
        echo "guest printed its result but did not power off within ${grace}s; stopped" >>"$dir/qemu.log"
        break
      fi
      sleep 1
    done
    if ((stopped)); then
      VM_QEMU_RC=200
    else
      wait "$qpid"
      VM_QEMU_RC=$?
    fi
  fi
  tr -d '\r' <"$dir/console.log" >"$dir/console.txt" 2>/dev/null
}

vm_verdict() {
  local name=$1 dir=$2 timeout_s=$3 shell=$4 rc=$VM_QEMU_RC
  VM_RESULT=$(grep -a "^CXLPOOL-VM-RESULT topology=$name " "$dir/console.txt" | tail -n1)
  grep -a '^CXLPOOL-VM-CHECK ' "$dir/console.txt" | sed "s/^CXLPOOL-VM-CHECK /  [$name] /"
  VM_STATUS=fail VM_WHY=""
  if [[ $rc -eq 200 ]]; then
    # Stopped after its result line (vm_qemu_run): judged on that line; the
    # files it meant to leave on the result disk are missing.
    vm_log "$name: the guest printed its result but did not power off; stopped" \
      "(its result disk, $dir/out, may be incomplete; qemu: $(tail -n 2 "$dir/qemu.log" | tr '\n' ' '))"
    rc=0
  fi
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    VM_WHY="timed out after ${timeout_s}s"
  elif [[ -z $VM_RESULT ]]; then
    VM_WHY="no result line (kernel panic, or the guest's checks never ran; qemu rc=$rc)"
  elif [[ $VM_RESULT == *" status=pass "* && $VM_RESULT == *" failed=0"* &&
          $VM_RESULT != *" passed=0 "* ]]; then
    VM_STATUS=pass
  else
    VM_WHY="guest reported failures"
  fi
  if [[ $VM_STATUS != pass ]] && ((!shell)); then
    # The first kernel report names the cause; later ones (and the tail) are
    # often its consequences.
    local first
    first=$(grep -a -n -m1 -E '(BUG:|Oops:|WARNING:|Kernel panic|general protection)' \
      "$dir/console.txt" | cut -d: -f1)
    if [[ -n $first ]]; then
      vm_log "$name: first kernel report (line $first of $dir/console.txt):"
      sed -n "$((first > 5 ? first - 5 : 1)),$((first + 30))p" "$dir/console.txt" |
        sed 's/^/    | /' >&2
    fi
    vm_log "$name: $VM_WHY; last console lines ($dir/console.txt):"
    tail -n 40 "$dir/console.txt" | sed 's/^/    | /' >&2
    [[ -s $dir/qemu.log ]] && sed 's/^/    qemu: /' "$dir/qemu.log" >&2
  fi
  return 0
}
