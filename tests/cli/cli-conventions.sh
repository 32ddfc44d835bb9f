#!/usr/bin/env bash
# The command-line conventions every cxlpool binary keeps (docs/service.md,
# cxlpoold(8), cxlpoolctl(8)):
#   - --help and --version on every binary (cxlpoold, cxlpoolctl and each of
#     its commands, the examples, the benches), exit 0;
#   - one exit-code table: 0 ok, 1 failed, 2 bad command line, 3 no daemon,
#     and the man pages list the same codes;
#   - cxlpoolctl's global options (--socket, --json) before or after the
#     command word, with the same result;
#   - no daemon: exit 3 and a message that asks whether cxlpoold runs and
#     names the socket it tried;
#   - metrics at a daemon's start, before any lease: promtool accepts them,
#     every counter is there at 0, cxlpool_build_info names the version,
#     unlimited limits are +Inf; `metrics --json` is JSON;
#   - stats in human units, "unlimited" for no limit;
#   - cxlpool-example --size takes suffixes (64M is 64 MiB) and refuses
#     garbage with exit 2;
#   - doctor's exit status follows its worst finding;
#   - log lines: a timestamp on a file or terminal, the sd-daemon priority
#     prefix when stderr is the journal ($JOURNAL_STREAM);
#   - the background mode: the parent exits once the child serves, the child
#     sits in / with stdio on /dev/null;
#   - a metrics.http_listen that cannot be bound exits 2 (which the unit does
#     not restart); the metrics socket passed by systemd is served;
#   - a config with the removed warm_stock key is refused (exit 2) naming
#     the key and its replacement;
#   - man pages render without a warning (mandoc -Tlint, groff -ww) and have
#     ENVIRONMENT and EXIT STATUS sections; every cxlpoolctl command and
#     option is in cxlpoolctl(8), every cxlpoold option in cxlpoold(8).
# usage: cli-conventions.sh <build-dir> <source-dir>
set -uo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
ctl=$build/tools/cxlpoolctl
daemon=$build/daemon/cxlpoold
version=$(sed -nE 's/^project\(cxlpool VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")
for b in "$ctl" "$daemon" "$build/examples/cxlpool-example" "$build/examples/cxlpool-example-cpp"; do
  [[ -x $b ]] || { echo "FAIL: $b not built"; exit 1; }
done
for t in jq; do command -v $t >/dev/null || { echo "SKIP: $t missing"; exit 77; }; done

work=$(mktemp -d /tmp/cxlpool-cli-XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failed=0 passed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
# expect_rc WANT NAME CMD...: runs CMD (stdout+stderr to $work/out), checks its status.
expect_rc() {
  local want=$1 name=$2 rc=0
  shift 2
  "$@" >"$work/out" 2>&1 </dev/null || rc=$?
  if [[ $rc == "$want" ]]; then ok "$name (exit $rc)"; else
    bad "$name: exit $rc, want $want: $(head -c 400 "$work/out" | tr '\n' ' ')"; fi
}
has() { grep -qF -- "$1" "$work/out"; }

# ---- --help / --version on every binary ------------------------------------
bins=("$daemon" "$ctl" "$build/examples/cxlpool-example" "$build/examples/cxlpool-example-cpp")
[[ -x $build/tools/bench/cxlpool-bench ]] && bins+=("$build/tools/bench/cxlpool-bench")
[[ -x $build/tools/bench/micro/cxlpool-microbench ]] && bins+=("$build/tools/bench/micro/cxlpool-microbench")
for b in "${bins[@]}"; do
  n=$(basename "$b")
  expect_rc 0 "$n --version" "$b" --version
  if grep -qE "^$n $version( |$)" "$work/out"; then ok "$n --version names $n $version"; else
    bad "$n --version: $(cat "$work/out")"; fi
  if [[ $n != cxlpool-microbench ]]; then
    expect_rc 0 "$n --help" "$b" --help
    [[ -s $work/out ]] && ok "$n --help prints" || bad "$n --help printed nothing"
  fi
done
expect_rc 2 "cxlpoold --bogus" "$daemon" --bogus
expect_rc 2 "cxlpoolctl --bogus" "$ctl" --bogus
expect_rc 2 "cxlpoolctl (no command)" "$ctl"
expect_rc 2 "cxlpoolctl frobnicate" "$ctl" frobnicate
has "unknown command 'frobnicate'" && ok "  names the unknown command" || bad "  $(cat "$work/out")"
# --help after an unknown command is still a usage error, not the top-level help.
expect_rc 2 "cxlpoolctl NOSUCH --help" "$ctl" NOSUCH --help
has "unknown command 'NOSUCH'" && ok "  names NOSUCH" || bad "  $(head -c 400 "$work/out")"
expect_rc 2 "cxlpoolctl --json NOSUCH --help" "$ctl" --json NOSUCH --help
expect_rc 2 "cxlpoolctl pools NOSUCH --help" "$ctl" pools NOSUCH --help
has "NOSUCH" && ok "  names the stray word" || bad "  $(head -c 400 "$work/out")"
expect_rc 2 "cxlpool-example --bogus" "$build/examples/cxlpool-example" --bogus
expect_rc 2 "cxlpool-example --size 64Q" "$build/examples/cxlpool-example" --size 64Q
has "is not a size" && ok "64Q refused as not a size" || bad "64Q message: $(cat "$work/out")"
expect_rc 2 "cxlpool-example --size 0" "$build/examples/cxlpool-example" --size 0
expect_rc 2 "cxlpool-example --node x" "$build/examples/cxlpool-example" --node x
expect_rc 2 "cxlpool-example-cpp '' 12XB" "$build/examples/cxlpool-example-cpp" "" 12XB
[[ -x $build/tools/bench/cxlpool-bench ]] &&
  expect_rc 2 "cxlpool-bench --bogus" "$build/tools/bench/cxlpool-bench" --bogus
[[ -x $build/tools/bench/micro/cxlpool-microbench ]] &&
  expect_rc 2 "cxlpool-microbench --bogus" "$build/tools/bench/micro/cxlpool-microbench" --bogus

# Every command and its --help (the list is cxlpoolctl's own).
"$ctl" --help >"$work/help" 2>&1
commands=$(sed -n '/^Subcommands:/,/^$/p' "$work/help" | awk 'NR > 1 && NF { print $1 }')
[[ -n $commands ]] || { bad "no commands in cxlpoolctl --help"; commands=""; }
for c in $commands; do
  expect_rc 0 "cxlpoolctl $c --help" "$ctl" "$c" --help
  cp "$work/out" "$work/help-$c"
  expect_rc 2 "cxlpoolctl $c --bogus" "$ctl" "$c" --bogus
done
expect_rc 0 "cxlpoolctl quota set --help" "$ctl" quota set --help
cp "$work/out" "$work/help-quota-set"

# ---- no daemon: exit 3 with advice ------------------------------------------
none=$work/no-such.sock
for c in pools leases stats quotas metrics "revoke 1" "quota set --uid 0 --max-leases 1" \
         "alloc --size 4K"; do
  # shellcheck disable=SC2086
  expect_rc 3 "cxlpoolctl $c without a daemon" "$ctl" --socket "$none" $c
  if has "is cxlpoold running?" && has "$none"; then ok "  says: is cxlpoold running? $none"
  else bad "  $c: no advice: $(cat "$work/out")"; fi
done
CXLPOOL_SOCKET=$none expect_rc 3 "CXLPOOL_SOCKET names the socket" "$ctl" pools
has "$none" && ok "  the message names \$CXLPOOL_SOCKET's path" || bad "  $(cat "$work/out")"

# ---- a daemon on a temp socket ----------------------------------------------
sock=$work/cxlpool.sock
cat >"$work/cxlpoold.toml" <<EOF
[daemon]
socket_mode = "0600"
[pools]
capacity = "64M"
pin = false
[[quota]]
uid = 4242
max_leases = 3
EOF
"$daemon" --foreground --config "$work/cxlpoold.toml" --socket "$sock" --state-dir "$work/state" \
  >"$work/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do "$ctl" --socket "$sock" stats >/dev/null 2>&1 && break; sleep 0.05; done

# Metrics first: before any lease, the first request but one.
"$ctl" --socket "$sock" metrics >"$work/metrics.txt" 2>&1
if command -v promtool >/dev/null; then
  if promtool check metrics <"$work/metrics.txt" >"$work/promtool.txt" 2>&1; then
    ok "promtool check metrics at start"
  else bad "promtool at start: $(head -c 600 "$work/promtool.txt")"; fi
else
  echo "skip promtool (not installed: Debian package prometheus)"
fi
empty=$(awk '/^# TYPE .* counter$/ { fam[$3] = 1 } !/^#/ { n = $1; sub(/[{ ].*/, "", n); seen[n] = 1 }
  END { for (f in fam) if (!seen[f]) print f }' "$work/metrics.txt")
[[ -z $empty ]] && ok "every counter family has samples at start" || bad "counters without samples: $empty"
zero=$(grep -cE '^cxlpool_[a-z_]*_total(\{[^}]*\})? 0$' "$work/metrics.txt")
((zero >= 20)) && ok "$zero counters exported at 0" || bad "only $zero counters at 0"
grep -qE "^cxlpool_build_info\{revision=\"[^\"]+\",version=\"$version\"\} 1$" "$work/metrics.txt" &&
  ok "cxlpool_build_info names $version" || bad "no build_info: $(grep build_info "$work/metrics.txt")"
grep -qE '^cxlpool_quota_max_bytes\{scope="uid",subject="4242",tier="all"\} \+Inf$' "$work/metrics.txt" &&
  ok "unlimited quota bytes are +Inf" || bad "quota_max_bytes: $(grep quota_max_bytes "$work/metrics.txt")"
grep -qE '^cxlpool_quota_max_leases\{scope="uid",subject="4242",tier="all"\} 3$' "$work/metrics.txt" &&
  ok "a set limit is its number" || bad "quota_max_leases: $(grep quota_max_leases "$work/metrics.txt")"
if grep -q "^# HELP cxlpool_[a-z_]* Lease-manager counter" "$work/metrics.txt"; then
  bad "placeholder HELP texts remain"; else ok "HELP texts are descriptions"; fi
# (jq turns 2^64-1 into a double: read the number as text.)
memlock=$("$ctl" --socket "$sock" --json stats | grep -oE '"memlock_limit_bytes": *[0-9]+' | grep -oE '[0-9]+$')
if [[ $memlock == 18446744073709551615 ]]; then
  grep -q '^cxlpool_memlock_limit_bytes +Inf$' "$work/metrics.txt" && ok "unlimited memlock is +Inf" ||
    bad "memlock: $(grep memlock "$work/metrics.txt")"
  "$ctl" --socket "$sock" stats >"$work/out" 2>&1
  grep -qE '^memlock_limit_bytes +gauge +unlimited *$' "$work/out" && ok "stats says unlimited" ||
    bad "stats: $(grep memlock "$work/out")"
else
  echo "skip memlock +Inf (the daemon's RLIMIT_MEMLOCK is $memlock here)"
fi
"$ctl" --socket "$sock" stats >"$work/out" 2>&1
grep -qE '^leased_bytes +gauge +[0-9.]+ (B|KiB|MiB|GiB)' "$work/out" && ok "stats bytes in human units" ||
  bad "stats bytes: $(grep -i bytes "$work/out" | head -3)"
expect_rc 0 "metrics --json" "$ctl" --socket "$sock" metrics --json
jq -e 'map(select(.name == "cxlpool_build_info"))[0].samples[0].labels.version' "$work/out" >/dev/null &&
  ok "metrics --json carries build_info" || bad "metrics --json: $(head -c 300 "$work/out")"

# Global options before and after the command word.
a=$("$ctl" --socket "$sock" --json pools 2>&1)
b=$("$ctl" pools --socket "$sock" --json 2>&1)
c=$("$ctl" --json pools --socket "$sock" 2>&1)
if [[ $a == "$b" && $b == "$c" ]] && jq -e 'length >= 1' <<<"$a" >/dev/null; then
  ok "--socket/--json before, after and around the command agree"
else bad "global options: '$a' vs '$b' vs '$c'"; fi
expect_rc 0 "cxlpoolctl --json quota set after the words" "$ctl" quota set --uid 4243 --max-leases 2 --socket "$sock" --json
jq -e '.subject == "4243"' "$work/out" >/dev/null && ok "  JSON reply" || bad "  $(cat "$work/out")"
expect_rc 1 "revoke of an unknown lease fails (1)" "$ctl" --socket "$sock" revoke 999999

# The example with a suffixed size leases exactly that.
expect_rc 0 "cxlpool-example --size 8M" "$build/examples/cxlpool-example" --socket "$sock" --size 8M --node 0
grep -q "size=8388608 " "$work/out" && ok "  8M is 8388608 bytes" || bad "  $(cat "$work/out")"
expect_rc 0 "cxlpool-example-cpp SOCKET 4M 0" "$build/examples/cxlpool-example-cpp" "$sock" 4M 0
grep -q "size=4194304 " "$work/out" && ok "  4M is 4194304 bytes" || bad "  $(cat "$work/out")"

# doctor: 1 exactly when the worst finding is a warning or an error.
rc=0
"$ctl" --socket "$sock" --json doctor >"$work/doctor.json" 2>/dev/null || rc=$?
worst=$(jq -r .worst "$work/doctor.json" 2>/dev/null)
case $worst in
  warning|error) want=1 ;;
  *) want=0 ;;
esac
[[ $rc == "$want" ]] && ok "doctor exits $rc with worst=$worst" || bad "doctor exit $rc with worst=$worst"

# ---- logs: timestamp on a file, priority prefix on the journal ---------------
printf '[pools]\ncapacty = 1\n' >"$work/bad.toml"
"$daemon" --config "$work/bad.toml" --foreground 2>"$work/plain.log" >/dev/null
rc=$?
[[ $rc == 2 ]] && ok "bad configuration exits 2" || bad "bad configuration exit $rc"
grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} E [a-z_.]+:[0-9]+\] .*capacty' \
  "$work/plain.log" && ok "a log line on a file starts with a timestamp" || bad "plain log: $(cat "$work/plain.log")"
: >"$work/journal.log"
js=$(stat -c '%d:%i' "$work/journal.log")
JOURNAL_STREAM=$js "$daemon" --config "$work/bad.toml" --foreground 2>>"$work/journal.log" >/dev/null
grep -qE '^<3>E [a-z_.]+:[0-9]+\] .*capacty' "$work/journal.log" &&
  ok "on the journal stream: <3> prefix, no timestamp" || bad "journal log: $(cat "$work/journal.log")"
JOURNAL_STREAM=1:2 "$daemon" --config "$work/bad.toml" --foreground 2>"$work/other.log" >/dev/null
grep -q '^<' "$work/other.log" && bad "a JOURNAL_STREAM of another file still got prefixes" ||
  ok "JOURNAL_STREAM naming another file: no prefix"

# ---- background mode ---------------------------------------------------------
bsock=$work/bg.sock
mkdir -p "$work/sub"
(cd "$work/sub" && "$daemon" --config "$work/cxlpoold.toml" --socket bg.sock --state-dir bgstate \
  >"$work/bg.out" 2>&1)
rc=$?
[[ $rc == 0 ]] && ok "background: the parent exits 0 once the child serves" || bad "background parent exit $rc"
bgpid=""
for p in /proc/[0-9]*; do
  { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "--socket bg.sock --state-dir bgstate" &&
    bgpid=${p#/proc/}
done
if [[ -n $bgpid ]]; then
  pids+=("$bgpid")
  [[ $(readlink "/proc/$bgpid/cwd") == / ]] && ok "background: cwd is /" || bad "background cwd $(readlink "/proc/$bgpid/cwd")"
  nulls=$(for f in 0 1 2; do readlink "/proc/$bgpid/fd/$f"; done | grep -c '^/dev/null$')
  [[ $nulls == 3 ]] && ok "background: stdin, stdout, stderr on /dev/null" || bad "background stdio: $(ls -l /proc/$bgpid/fd/ | head -5)"
  [[ -S $work/sub/bg.sock ]] && ok "background: relative --socket resolved before chdir" || bad "no $work/sub/bg.sock"
  "$ctl" --socket "$work/sub/bg.sock" pools >/dev/null 2>&1 && ok "background daemon serves" || bad "background daemon does not answer"
  kill "$bgpid"
else
  bad "background daemon not found"
fi

# ---- metrics endpoint: a port that cannot be bound; a socket from systemd ----
port=""
for try in $(seq 20); do
  p=$((20000 + RANDOM % 40000))
  printf '[pools]\ncapacity = "16M"\npin = false\n[metrics]\nhttp_listen = "127.0.0.1:%s"\n' "$p" >"$work/http.toml"
  "$daemon" --foreground --config "$work/http.toml" --socket "$work/h1.sock" >"$work/h1.log" 2>&1 &
  h1=$!
  for _ in $(seq 100); do [[ -S $work/h1.sock ]] && break; kill -0 $h1 2>/dev/null || break; sleep 0.05; done
  if [[ -S $work/h1.sock ]]; then port=$p; pids+=($h1); break; fi
  wait $h1 2>/dev/null
done
if [[ -n $port ]]; then
  expect_rc 2 "metrics.http_listen in use: exit 2 (not restarted by the unit)" \
    "$daemon" --foreground --config "$work/http.toml" --socket "$work/h2.sock"
  has "metrics.http_listen" && ok "  the message names the key" || bad "  $(cat "$work/out")"
else
  bad "no free port for the metrics endpoint"
fi
if command -v systemd-socket-activate >/dev/null && [[ -n $port ]]; then
  kill "$h1"; wait "$h1" 2>/dev/null
  printf '[pools]\ncapacity = "16M"\npin = false\n' >"$work/sa.toml"
  systemd-socket-activate -l "$work/sa.sock" -l "127.0.0.1:$port" --fdname=cxlpoold.socket:metrics \
    "$daemon" --foreground --config "$work/sa.toml" >"$work/sa.log" 2>&1 &
  pids+=($!)
  # systemd-socket-activate starts the daemon on the first connection.
  for _ in $(seq 200); do "$ctl" --socket "$work/sa.sock" pools >/dev/null 2>&1 && break; sleep 0.05; done
  resp=$(exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3 && cat <&3)
  grep -q '^cxlpool_build_info' <<<"$resp" && ok "the metrics socket from systemd is served" ||
    bad "metrics over the passed socket: $(head -c 300 <<<"$resp"); $(tail -3 "$work/sa.log")"
fi

# ---- a removed config key ----------------------------------------------------
# warm_stock was replaced by the reserve: refused at start (exit 2), naming the
# file, the key and what to set instead.
printf '[pools]\ncapacity = "16M"\nwarm_stock = [{ size = "2M", count = 1 }]\n' >"$work/warm.toml"
expect_rc 2 "cxlpoold --check-config refuses warm_stock" \
  "$daemon" --check-config --config "$work/warm.toml"
has "$work/warm.toml: pools.warm_stock: removed; set reserve_low and reserve_high" &&
  ok "  the message names the file, the key and the replacement" || bad "  $(cat "$work/out")"
expect_rc 2 "cxlpoold refuses to start with warm_stock" \
  "$daemon" --foreground --config "$work/warm.toml" --socket "$work/warm.sock"

# ---- man pages ----------------------------------------------------------------
man=$src/docs/man
for page in "$man"/*.[1-9]; do
  n=$(basename "$page")
  if command -v mandoc >/dev/null; then
    out=$(mandoc -Tlint -Wwarning "$page" 2>&1)
    [[ -z $out ]] && ok "mandoc -Tlint $n" || bad "mandoc $n: $out"
  fi
  if command -v groff >/dev/null; then
    out=$(groff -ww -z -man "$page" 2>&1)
    [[ -z $out ]] && ok "groff -ww $n" || bad "groff $n: $out"
  fi
  for s in "ENVIRONMENT" "SEE ALSO"; do
    grep -q "^\.SH $s" "$page" && ok "$n has $s" || bad "$n has no $s section"
  done
done
for page in cxlpoold.8 cxlpoolctl.8; do
  grep -q '^\.SH EXIT STATUS' "$man/$page" || bad "$page has no EXIT STATUS"
  codes=$(sed -n '/^\.SH EXIT STATUS/,/^\.SH /p' "$man/$page" | sed -n 's/^\.B \([0-9]\)$/\1/p' | tr '\n' ' ')
  case $page in
    cxlpoolctl.8) want="0 1 2 3 " ; helpline=$("$ctl" --help) ;;
    cxlpoold.8) want="0 1 2 " ; helpline=$("$daemon" --help) ;;
  esac
  [[ $codes == "$want" ]] && ok "$page lists exit codes $codes" || bad "$page exit codes '$codes', want '$want'"
  for c in $want; do
    grep -q "$c [a-z]" <<<"${helpline//$'\n'/ }" || bad "--help of $page's binary does not list exit $c"
  done
done
# Every cxlpoolctl command and option is in cxlpoolctl(8), every cxlpoold option in cxlpoold(8).
sed 's/\\-/-/g' "$man/cxlpoolctl.8" >"$work/cxlpoolctl.8.txt"
sed 's/\\-/-/g' "$man/cxlpoold.8" >"$work/cxlpoold.8.txt"
for c in $commands; do
  grep -qE "^\.SS \"?$c( |\"|$)" "$work/cxlpoolctl.8.txt" && ok "cxlpoolctl.8 documents $c" || bad "cxlpoolctl.8 lacks command $c"
  for o in $(grep -oE -- '--[a-z][a-z-]+' "$work/help-$c" | sort -u); do
    grep -qF -- "$o" "$work/cxlpoolctl.8.txt" || bad "cxlpoolctl.8 lacks $c's option $o"
  done
done
for o in $(grep -oE -- '--[a-z][a-z-]+' "$work/help-quota-set" | sort -u); do
  grep -qF -- "$o" "$work/cxlpoolctl.8.txt" || bad "cxlpoolctl.8 lacks quota set's option $o"
done
for o in $("$daemon" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
  grep -qF -- "$o" "$work/cxlpoold.8.txt" || bad "cxlpoold.8 lacks option $o"
done

echo "cli conventions: $passed passed, $failed failed"
((failed == 0))
