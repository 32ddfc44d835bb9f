#!/usr/bin/env bash
# Checks the systemd units offline: `systemd-analyze verify` accepts them,
# `systemd-analyze security --offline=true` rates cxlpoold.service at an
# exposure of 2.0 or less, configuration errors are not restarted, and the
# metrics endpoint comes through cxlpoold-metrics.socket. (tests/vm's
# systemd guest runs them under a real systemd.) Usage: check-units.sh <built-unit-dir> <src-unit-dir> <cxlpoold>
set -euo pipefail
built=$1 src=$2 daemon=$3
command -v systemd-analyze >/dev/null || { echo "SKIP: no systemd-analyze"; exit 77; }
[[ -x $daemon ]] || { echo "FAIL: daemon binary $daemon missing"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The unit names the installed path; point it at the binary we built.
sed -E "s#^ExecStart=[^ ]+#ExecStart=$daemon#" "$built/cxlpoold.service" >"$work/cxlpoold.service"
cp "$src/cxlpoold.socket" "$src/cxlpoold-metrics.socket" "$work/"
out=$(systemd-analyze verify --man=no "$work/cxlpoold.service" "$work/cxlpoold.socket" \
  "$work/cxlpoold-metrics.socket" 2>&1 || true)
# verify complains about the cxlpool user/group only when it does not exist on
# this machine; anything else is a real problem.
bad=$(printf '%s\n' "$out" | grep -v -E "^$|Failed to resolve (user|group)|cxlpool(-admin)?: (user|group)" || true)
if [[ -n $bad ]]; then
  echo "FAIL: systemd-analyze verify:"; printf '%s\n' "$bad"; exit 1
fi
echo "verify: ok"
sec=$(systemd-analyze security --offline=true --no-pager "$work/cxlpoold.service" 2>&1 | tail -n 1)
echo "$sec"
level=$(printf '%s\n' "$sec" | sed -nE 's/.*Overall exposure level for cxlpoold.service: ([0-9.]+).*/\1/p')
[[ -n $level ]] || { echo "FAIL: could not read exposure level"; exit 1; }
awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }' || { echo "FAIL: exposure $level > 2.0"; exit 1; }
echo "exposure $level <= 2.0: ok"
# The opt-in sampling drop-in, as an operator installs it: it adds
# CAP_SYS_ADMIN and nothing else, and the unit stays at 2.0 or less.
root=$work/root
mkdir -p "$root/etc/systemd/system/cxlpoold.service.d"
cp "$work/cxlpoold.service" "$work/cxlpoold.socket" "$work/cxlpoold-metrics.socket" "$root/etc/systemd/system/"
cp "$built/cxlpoold-sampling.conf" "$root/etc/systemd/system/cxlpoold.service.d/sampling.conf"
[[ $(grep -vE '^(#|$)' "$built/cxlpoold-sampling.conf") == $'[Service]\nAmbientCapabilities=CAP_SYS_ADMIN\nCapabilityBoundingSet=CAP_SYS_ADMIN' ]] ||
  { echo "FAIL: cxlpoold-sampling.conf does more than add CAP_SYS_ADMIN"; exit 1; }
sec=$(systemd-analyze security --offline=true --root="$root" --no-pager cxlpoold.service 2>&1)
grep -qE '✗ CapabilityBoundingSet=~CAP_SYS_ADMIN' <<<"$sec" ||
  { echo "FAIL: the drop-in did not reach the unit:"; printf '%s\n' "$sec" | tail -n 3; exit 1; }
with=$(printf '%s\n' "$sec" | sed -nE 's/.*Overall exposure level for cxlpoold.service: ([0-9.]+).*/\1/p')
[[ -n $with ]] && awk -v l="$with" -v b="$level" 'BEGIN { exit !(l > b && l <= 2.0) }' ||
  { echo "FAIL: exposure with the sampling drop-in '$with' (without: $level), want above it and <= 2.0"; exit 1; }
echo "sampling drop-in: CAP_SYS_ADMIN added, exposure $with <= 2.0: ok"
# Hardening directives stay in alphabetical order (from AmbientCapabilities= on).
keys=$(sed -n '/^AmbientCapabilities=/,/^$/p' "$built/cxlpoold.service" | sed -nE 's/^([A-Za-z]+)=.*/\1/p' | uniq)
if [[ "$keys" != "$(printf '%s\n' "$keys" | LC_ALL=C sort)" ]]; then
  echo "FAIL: hardening directives not in alphabetical order"; exit 1
fi
echo "order: ok"
# No restart loop: a configuration error (exit 2) is not restarted, and the
# metrics endpoint's socket comes from systemd (the service has no network).
grep -qx 'RestartPreventExitStatus=2' "$built/cxlpoold.service" ||
  { echo "FAIL: no RestartPreventExitStatus=2"; exit 1; }
grep -qx 'PrivateNetwork=yes' "$built/cxlpoold.service" || { echo "FAIL: no PrivateNetwork=yes"; exit 1; }
grep -qx 'ListenStream=127.0.0.1:9464' "$src/cxlpoold-metrics.socket" &&
  grep -qx 'Service=cxlpoold.service' "$src/cxlpoold-metrics.socket" &&
  grep -qx 'FileDescriptorName=metrics' "$src/cxlpoold-metrics.socket" ||
  { echo "FAIL: cxlpoold-metrics.socket: loopback 9464, passed to cxlpoold.service as 'metrics'"; exit 1; }
echo "restart and metrics socket: ok"
