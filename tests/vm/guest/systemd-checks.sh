#!/bin/bash
# Guest side of tests/vm/run-systemd-vm.sh: runs as cxlpool-vm-checks.service
# once Debian's systemd (PID 1) has reached multi-user.target. Installs the
# project's packages with dpkg -i and checks the service as shipped. Results:
# CXLPOOL-VM-CHECK lines and a CXLPOOL-VM-RESULT line on the console, /out (a
# tar on /dev/vdb) with the log, the journal and the unit states. Every wait
# is bounded.
export PATH=/opt/cxlpool/bin:/usr/sbin:/usr/bin:/sbin:/bin
VM_TOPOLOGY=systemd
# shellcheck source=lib.sh
. /vm/lib.sh
SOCK=/run/cxlpool/cxlpool.sock
CONF=/etc/cxlpool/cxlpoold.toml

prop() { systemctl show -P "$2" "$1"; }
# wait_for SECONDS CMD...: polls CMD every 0.2 s until it succeeds.
wait_for() {
  local n=$(($1 * 5))
  shift
  while ((n-- > 0)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}
metric() {  # NAME{labels} -> value (from cxlpoolctl metrics)
  cxlpoolctl metrics 2>/dev/null | awk -v k="$1" '$1 == k { print $2 }'
}
finish() {
  vm_note "checks done"
  {
    systemctl --no-pager list-units --all 'cxlpool*' 2>&1
    systemctl --no-pager status cxlpoold.service cxlpoold.socket 2>&1
    systemd-analyze security --no-pager cxlpoold.service 2>&1
  } >/out/units.txt
  journalctl -b --no-pager -o short-monotonic >/out/journal.txt 2>&1
  vm_result
  (cd /out && tar -cf /dev/vdb .) || echo "CXLPOOL-VM-NOTE could not write /dev/vdb"
  sync
  if [[ -f /vm/shell ]]; then
    echo "cxlpool systemd VM: results in /out; 'poweroff -f' (or Ctrl-A x) to leave"
    setsid -w /sbin/agetty --autologin root --noclear ttyS0 115200 linux
  fi
  echo o >/proc/sysrq-trigger
  sleep 30
}
trap finish EXIT

vm_note "kernel $(uname -r); $(systemctl --version | head -n1)"
vm_check_eq "PID 1 is systemd" "$(cat /proc/1/comm)" "systemd"
state=$(systemctl is-system-running 2>/dev/null)
vm_note "system state: $state; failed units: $(systemctl --failed --plain --no-legend | awk '{print $1}' | tr '\n' ' ')"

# ---- dpkg -i -------------------------------------------------------------------
vm_check "dpkg -i libcxlpool0 cxlpool" dpkg -i /vm/debs/libcxlpool0_*.deb /vm/debs/cxlpool_*.deb
vm_check "postinst: system user cxlpool" getent passwd cxlpool
vm_check "postinst: group cxlpool-admin" getent group cxlpool-admin
vm_check_eq "postinst: /run/cxlpool" "$(stat -c '%U:%G %a' /run/cxlpool 2>&1)" "root:cxlpool 755"
vm_check_eq "postinst: /var/lib/cxlpool" "$(stat -c '%U %a' /var/lib/cxlpool 2>&1)" "cxlpool 700"
vm_check_eq "cxlpoold.socket enabled" "$(systemctl is-enabled cxlpoold.socket)" "enabled"
vm_check_eq "cxlpoold.socket listening" "$(systemctl is-active cxlpoold.socket)" "active"
vm_check_eq "cxlpoold.service not started by the install" "$(systemctl is-active cxlpoold.service)" "inactive"
vm_check_eq "socket mode and group" "$(stat -c '%a %G' $SOCK 2>&1)" "660 cxlpool"
vm_check_eq "shipped admin_group" "$(sed -n 's/^admin_group = //p' $CONF)" '"cxlpool-admin"'

# ---- socket activation, READY=1 ----------------------------------------------
vm_check "socket activation: the first client starts cxlpoold" cxlpoolctl pools
vm_check_eq "started by the socket: active" "$(systemctl is-active cxlpoold.service)" "active"
pid=$(prop cxlpoold.service MainPID)
vm_check_eq "the daemon runs as user cxlpool" \
  "$(awk '/^Uid:/ { print $2 }' /proc/$pid/status)" "$(id -u cxlpool)"
vm_check "READY=1: status text from the daemon" \
  bash -c "systemctl show -P StatusText cxlpoold.service | grep -q 'serving on'"
vm_check "systemctl stop" systemctl stop cxlpoold.service
vm_check_eq "stopped cleanly (exit 0)" "$(prop cxlpoold.service ExecMainStatus)" "0"
vm_check "systemctl start (returns after READY=1)" systemctl start cxlpoold.service
vm_check_eq "after systemctl start: running" "$(prop cxlpoold.service SubState)" "running"
vm_check "the daemon answers at once" cxlpoolctl stats

# ---- the watchdog --------------------------------------------------------------
mkdir -p /etc/systemd/system/cxlpoold.service.d
printf '[Service]\nWatchdogSec=6s\nTimeoutStopSec=5s\n' >/etc/systemd/system/cxlpoold.service.d/watchdog.conf
systemctl daemon-reload
vm_check "restart with WatchdogSec=6s" systemctl restart cxlpoold.service
w0=$(prop cxlpoold.service WatchdogTimestampMonotonic)
vm_check "WATCHDOG=1 pings arrive (timestamp moves)" \
  wait_for 20 bash -c "[ \"\$(systemctl show -P WatchdogTimestampMonotonic cxlpoold.service)\" != '$w0' ]"
r0=$(prop cxlpoold.service NRestarts)
pid=$(prop cxlpoold.service MainPID)
kill -STOP "$pid"
vm_check "a hung daemon is killed by the watchdog and restarted" \
  wait_for 60 bash -c "[ \"\$(systemctl show -P NRestarts cxlpoold.service)\" -gt $r0 ] && \
    [ \"\$(systemctl show -P MainPID cxlpoold.service)\" != $pid ] && \
    [ \"\$(systemctl show -P SubState cxlpoold.service)\" = running ]"
vm_check "the journal names the watchdog" \
  bash -c "journalctl -u cxlpoold --no-pager | grep -qi 'watchdog timeout'"
rm -f /etc/systemd/system/cxlpoold.service.d/watchdog.conf
systemctl daemon-reload
systemctl restart cxlpoold.service

# ---- systemctl restart with a client holding a lease ---------------------------
mkfifo /tmp/hold.in
cxlpool-vm-client hold --size 8388608 </tmp/hold.in >/tmp/hold.out 2>&1 &
holder=$!
exec 7>/tmp/hold.in
if wait_for 30 grep -q '^READY ' /tmp/hold.out; then
  lease=$(awk '/^READY/ { print $2 }' /tmp/hold.out)
  vm_pass "a client holds lease $lease (8 MiB, pattern written)"
  vm_check "the fd store holds the lease's memfd" \
    bash -c "[ \"\$(systemctl show -P NFileDescriptorStore cxlpoold.service)\" -ge 1 ]"
  adopted0=$(metric 'cxlpool_lease_events_total{event="restart_adopted"}')
  pid=$(prop cxlpoold.service MainPID)
  vm_check "systemctl restart" systemctl restart cxlpoold.service
  vm_check "a new daemon process" bash -c "[ \"\$(systemctl show -P MainPID cxlpoold.service)\" != $pid ]"
  vm_check "the new daemon adopted the lease from the fd store" \
    wait_for 20 bash -c "[ \"\$(cxlpoolctl metrics | awk '\$1 == \"cxlpool_lease_events_total{event=\\\"restart_adopted\\\"}\" { print \$2 }')\" -ge 1 ]"
  vm_note "restart_adopted before: ${adopted0:-none} (a new daemon starts at 0)"
  vm_check "the client's library reclaimed it (holder back)" \
    wait_for 40 bash -c "cxlpoolctl --json leases --all | jq -e '.[] | select(.id == $lease and .holders == 1)'"
  echo go >&7
  exec 7>&-
  wait "$holder"
  rc=$?
  vm_check_eq "the client's mapping is intact and its release accepted" \
    "$rc $(grep -o 'corrupt=[0-9]* revoked=[0-9]* release=[A-Za-z_]*' /tmp/hold.out)" \
    "0 corrupt=0 revoked=0 release=success"
  vm_check "the lease is gone after the release" \
    wait_for 10 bash -c "cxlpoolctl --json leases --all | jq -e 'map(select(.id == $lease)) | length == 0'"
else
  vm_fail "the holding client did not get a lease: $(cat /tmp/hold.out)"
  exec 7>&-
  kill "$holder" 2>/dev/null
fi

# ---- systemctl reload: a quota change; journalctl -p warning -------------------
pid=$(prop cxlpoold.service MainPID)
cp $CONF /tmp/cxlpoold.toml.orig
sed -i 's/^workers = 2$/workers = 3/' $CONF
printf '\n[[quota]]\nuid = 4321\nmax_leases = 2\n' >>$CONF
vm_check "systemctl reload" systemctl reload cxlpoold.service
vm_check "the reload applied the quota change" \
  wait_for 20 bash -c "cxlpoolctl --json quotas | jq -e '.[] | select(.subject == \"4321\" and .max_leases == 2)'"
vm_check_eq "reload kept the process" "$(prop cxlpoold.service MainPID)" "$pid"
vm_check "journalctl -u cxlpoold -p warning shows the kept change" \
  wait_for 10 bash -c "journalctl -u cxlpoold -p warning -o cat --no-pager | grep -q 'SIGHUP: .*workers'"
vm_check "... at priority 4" \
  bash -c "journalctl -u cxlpoold -p warning -o json --no-pager | jq -e 'select(.MESSAGE | test(\"SIGHUP: .*workers\")) | .PRIORITY == \"4\"' | grep -q true"
vm_check "info lines are in the journal" \
  bash -c "journalctl -u cxlpoold -o cat --no-pager | grep -q 'listening on'"
vm_check "... but not at -p warning" \
  bash -c "! journalctl -u cxlpoold -p warning -o cat --no-pager | grep -q 'listening on'"
vm_check "journal lines carry no timestamp of their own" \
  bash -c "! journalctl -u cxlpoold -o cat --no-pager | grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2} '"
cp /tmp/cxlpoold.toml.orig $CONF
systemctl reload cxlpoold.service

# ---- the admin group as shipped ------------------------------------------------
useradd -M -N -g cxlpool -G cxlpool-admin vmadmin
useradd -M -N -g cxlpool vmuser
useradd -M -N vmother
vm_check "a cxlpool-admin member may set quotas" \
  runuser -u vmadmin -- cxlpoolctl quota set --uid 4322 --max-leases 1
vm_check "... and list every tenant's leases" runuser -u vmadmin -- cxlpoolctl leases --all
runuser -u vmuser -- cxlpoolctl quota set --uid 4323 --max-leases 1 >/tmp/user.out 2>&1
vm_check_eq "a cxlpool member without the admin group is refused (exit 1)" \
  "$? $(grep -c PERMISSION_DENIED /tmp/user.out)" "1 1"
vm_check "... but may use the daemon" runuser -u vmuser -- cxlpoolctl pools
runuser -u vmother -- cxlpoolctl pools >/tmp/other.out 2>&1
vm_check_eq "outside the cxlpool group: exit 3 with advice" \
  "$? $(grep -c 'usermod -aG cxlpool' /tmp/other.out)" "3 1"

# ---- python3-cxlpool, configured for real (py3compile) -------------------------
vm_check "dpkg -i python3-cxlpool (postinst byte-compiles)" dpkg -i /vm/debs/python3-cxlpool_*.deb
vm_check_eq "python3-cxlpool configured" \
  "$(dpkg-query -W -f='${Status}' python3-cxlpool 2>&1)" "install ok installed"
vm_check "py3compile made the module's bytecode" \
  bash -c "ls /usr/lib/python3/dist-packages/cxlpool/__pycache__/__init__.cpython-*.pyc"
vm_check "import cxlpool as a cxlpool member: a 4 MiB lease, written and read back" \
  runuser -u vmuser -- python3 -I -c '
import cxlpool
with cxlpool.Client() as c:
    with c.allocate(4 << 20, label="vm-python") as lease:
        m = memoryview(lease)
        m[0] = 7
        m[len(m) - 1] = 9
        assert (m[0], m[len(m) - 1], len(m)) == (7, 9, 4 << 20), (m[0], len(m))
        del m
print("python", cxlpool.__version__)'
vm_check "dpkg -r python3-cxlpool (prerm py3clean)" dpkg -r python3-cxlpool
vm_check "the bytecode went with it" test ! -e /usr/lib/python3/dist-packages/cxlpool

# ---- metrics over HTTP through cxlpoold-metrics.socket --------------------------
# A socket cannot join a service that runs (systemd refuses): stop it first.
vm_check "systemctl enable cxlpoold-metrics.socket" systemctl enable cxlpoold-metrics.socket
vm_check "stop the service, start the metrics socket" \
  bash -c "systemctl stop cxlpoold.service && systemctl start cxlpoold-metrics.socket"
http_get() {
  exec 5<>/dev/tcp/127.0.0.1/9464 || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&5
  cat <&5
  exec 5>&-
}
http_get >/tmp/http.out 2>&1
vm_check "GET http://127.0.0.1:9464/metrics (the request starts the daemon)" \
  bash -c "grep -q '^HTTP/1.[01] 200' /tmp/http.out && grep -q '^cxlpool_build_info{' /tmp/http.out"
vm_check_eq "started by the metrics socket" "$(systemctl is-active cxlpoold.service)" "active"
vm_check "systemctl restart keeps the endpoint" systemctl restart cxlpoold.service
http_get >/tmp/http.out 2>&1
vm_check "GET /metrics after the restart" grep -q '^cxlpool_build_info{' /tmp/http.out
sec=$(systemd-analyze security --no-pager cxlpoold.service 2>&1 | sed -nE 's/.*Overall exposure level for cxlpoold.service: ([0-9.]+).*/\1/p')
vm_check "systemd-analyze security (live unit): $sec <= 2.0" awk -v l="${sec:-99}" 'BEGIN { exit !(l <= 2.0) }'

# ---- the opt-in sampling drop-in: CAP_SYS_ADMIN, and pagemap shows frames --------
capeff() { sed -nE 's/^CapEff:[[:space:]]+([0-9a-f]+)$/\1/p' "/proc/$(pidof cxlpoold)/status"; }
has_sys_admin() { (( (16#$(capeff) >> 21) & 1 )); }  # CAP_SYS_ADMIN is bit 21
vm_check "without the drop-in: no CAP_SYS_ADMIN" bash -c "$(declare -f capeff has_sys_admin); ! has_sys_admin"
vm_check "... and the daemon says pagemap hides frame numbers" \
  bash -c "journalctl -u cxlpoold -o cat --no-pager | grep 'kernel access sampling' | tail -n 1 | grep -q 'pagemap PFNs hidden'"
mkdir -p /etc/systemd/system/cxlpoold.service.d
cp /usr/share/cxlpool/cxlpoold-sampling.conf /etc/systemd/system/cxlpoold.service.d/sampling.conf
systemctl daemon-reload
vm_check "restart with cxlpoold-sampling.conf" systemctl restart cxlpoold.service
wait_for 30 bash -c "journalctl -u cxlpoold -o cat --no-pager | grep 'kernel access sampling' | tail -n 1 | grep -q 'pagemap PFNs visible'" || true
vm_check "with the drop-in: CAP_SYS_ADMIN" bash -c "$(declare -f capeff has_sys_admin); has_sys_admin"
vm_check "... and the daemon sees the frame numbers" \
  bash -c "journalctl -u cxlpoold -o cat --no-pager | grep 'kernel access sampling' | tail -n 1 | grep -q 'pagemap PFNs visible'"
sec=$(systemd-analyze security --no-pager cxlpoold.service 2>&1 | sed -nE 's/.*Overall exposure level for cxlpoold.service: ([0-9.]+).*/\1/p')
vm_check "systemd-analyze security with the drop-in: $sec <= 2.0" awk -v l="${sec:-99}" 'BEGIN { exit !(l <= 2.0) }'
rm -r /etc/systemd/system/cxlpoold.service.d
systemctl daemon-reload
systemctl restart cxlpoold.service

# ---- a configuration error: exit 2, not restarted ------------------------------
sed -i 's/^http_listen = ""$/http_listen = "127.0.0.1:9470"/' $CONF
systemctl disable --now cxlpoold-metrics.socket >/dev/null 2>&1
systemctl restart cxlpoold.service >/dev/null 2>&1
sleep 5
vm_check_eq "metrics.http_listen under the unit: failed with status 2, no restart loop" \
  "$(prop cxlpoold.service ActiveState) $(prop cxlpoold.service ExecMainStatus) $(prop cxlpoold.service NRestarts)" \
  "failed 2 0"
vm_check "... and the journal says what to do" \
  bash -c "journalctl -u cxlpoold -p err -o cat --no-pager | grep -q 'cxlpoold-metrics.socket'"
cp /tmp/cxlpoold.toml.orig $CONF
systemctl reset-failed cxlpoold.service
vm_check "fixed configuration: starts again" systemctl start cxlpoold.service

# ---- removal ---------------------------------------------------------------------
vm_check "dpkg --purge cxlpool (stops the units)" dpkg --purge cxlpool
vm_check_eq "socket unit gone" "$(systemctl is-active cxlpoold.socket)" "inactive"
vm_check "no daemon left" bash -c "! pidof cxlpoold"
vm_check "purge removed /var/lib/cxlpool" test ! -e /var/lib/cxlpool
exit 0
