#!/usr/bin/env bash
# CI in a fresh Debian 12 root: runs the README's test command
#   ./scripts/install-deps.sh --vm && ./scripts/test.sh
# inside a minimal Debian 12 made with debootstrap (bookworm, minbase, plus
# git as the README assumes), on a clean clone of this repository's HEAD, in
# a chroot with /proc, /sys and /dev (with /dev/kvm if the host has it)
# mounted for the VM tier. Nothing the build machine happens to have leaks
# in, so a package install-deps.sh forgets fails here, not on a user's
# machine. Prints the time of each step, its own and test.sh's.
#
# usage: scripts/ci-fresh-root.sh [--keep] [--rev REV]
#   --keep      leave the root (and its build folders) for inspection
#   --rev REV   the commit to clone (default HEAD; uncommitted changes are
#               not in the clone)
# environment:
#   CXLPOOL_CI_CACHE     cache folder (default /var/cache/cxlpool-ci, else
#                        $XDG_CACHE_HOME/cxlpool-ci): the base root's tarball,
#                        remade when older than CXLPOOL_CI_BASE_MAX_AGE_DAYS
#                        (7); an optimisation only, a fresh machine makes it
#   CXLPOOL_CI_WORKDIR   where the root is unpacked (default /var/tmp; needs
#                        ~12 GB for the build folders)
#   CXLPOOL_CI_MIRROR    Debian mirror (default http://deb.debian.org/debian)
#   CXLPOOL_CI_VM_CACHE  1 (default): keep the VM tier's kernel and guest root
#                        between runs (CXLPOOL_CI_CACHE/vm); 0: fetch them
#   CXLPOOL_CI_APT_CACHE 1 (default): keep the .deb files install-deps.sh
#                        downloads (CXLPOOL_CI_CACHE/apt-archives), so a run
#                        installs them without fetching them; 0: fetch them
#   CXLPOOL_CI_CCACHE    1 (default): keep a ccache between runs
#                        (CXLPOOL_CI_CACHE/ccache); 0: compile from scratch
#   CXLPOOL_CI_FRESH_ROOT  what to do when this machine cannot make the root
#                        (not root, no mount or chroot, no debootstrap, the
#                        mirror unreachable, too little disk):
#                        auto (default): say so in a banner and run the test
#                        command on the host, in this clone, instead;
#                        require: fail (exit 1); host: skip the root on purpose
#   CXLPOOL_TEST_STAGES, CXLPOOL_JOBS, CXLPOOL_FUZZ_SECONDS: passed to test.sh
# Needs root (debootstrap, mount, chroot); installs debootstrap on the host
# with apt-get when it is missing. Every mount is undone on every exit path.
# Only the root's making can fall back to the host: once the test command
# runs in the root, its exit status is the result.
# The whole script is one brace group, read before any of it runs: editing
# the file while a run is in progress (it takes an hour) cannot break it.
{
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
keep=0 rev=HEAD
while (($#)); do
  case $1 in
    --keep) keep=1 ;;
    --rev) rev=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ci-fresh-root: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
log() { echo "ci-fresh-root: $*" >&2; }

# The README's test command, exactly (and .ci/run runs nothing else).
test_cmd='./scripts/install-deps.sh --vm && ./scripts/test.sh'
grep -qxF "$test_cmd" "$src/README.md" ||
  { log "README.md no longer has the test command '$test_cmd' on a line of its own"; exit 1; }

mode=${CXLPOOL_CI_FRESH_ROOT:-auto}
case $mode in
  auto | require | host) ;;
  *) log "CXLPOOL_CI_FRESH_ROOT=$mode: expected auto, require or host"; exit 2 ;;
esac

suite=bookworm
mirror=${CXLPOOL_CI_MIRROR:-http://deb.debian.org/debian}
include=git
if [[ -n ${CXLPOOL_CI_CACHE:-} ]]; then
  cache=$CXLPOOL_CI_CACHE
elif mkdir -p /var/cache/cxlpool-ci 2>/dev/null && [[ -w /var/cache/cxlpool-ci ]]; then
  cache=/var/cache/cxlpool-ci
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/cxlpool-ci
fi
max_age=${CXLPOOL_CI_BASE_MAX_AGE_DAYS:-7}
ci_budget_s=$((90 * 60))  # CI's limit for the whole run

# ---- step times ----------------------------------------------------------------
step_say() { log "$*"; }
# shellcheck source=lib/steps.sh
source "$src/scripts/lib/steps.sh"

# ---- undoing the root (on every exit path) ------------------------------------
work="" root="" mounts=() fallback="" host_child=""
undo_root() {
  local i p sig
  # The host run's process group (setsid), when a signal ended it early.
  if [[ -n $host_child ]] && kill -0 "$host_child" 2>/dev/null; then
    kill -TERM -- "-$host_child" 2>/dev/null
    sleep 2
    kill -KILL -- "-$host_child" 2>/dev/null
  fi
  if [[ -n $root ]]; then
    # Processes still running in the root are ours (started by the chroot).
    for sig in TERM KILL; do
      for p in /proc/[0-9]*; do
        [[ $(readlink "$p/root" 2>/dev/null) == "$root" ]] && kill -s $sig "${p#/proc/}" 2>/dev/null
      done
      sleep 1
    done
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
      umount -R "${mounts[i]}" 2>/dev/null || umount -R -l "${mounts[i]}" 2>/dev/null ||
        log "could not unmount ${mounts[i]}"
    done
    mounts=()
    if grep -qF " $root/" /proc/self/mounts; then
      log "mounts left under $root; not removing it:"
      grep -F " $root/" /proc/self/mounts | sed 's/^/    /' >&2
      keep=1
    fi
  fi
  if [[ -n $work ]]; then
    if ((keep)); then log "root kept in $root"; else rm -rf "$work"; fi
  fi
  work="" root=""
}
banner() {
  local l
  log "########################################################################"
  for l; do log "## $l"; done
  log "########################################################################"
}
fallback_banner() {
  banner "NOT A FRESH-ROOT RUN: $fallback" \
    "The README's test command ran on this machine's own system instead, so a" \
    "package that install-deps.sh forgets is NOT caught by this run." \
    "CXLPOOL_CI_FRESH_ROOT=require makes this a failure (docs/testing.md)."
}
cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM HUP
  end_step
  undo_root
  step_summary "$rc"
  if ((SECONDS > ci_budget_s * 5 / 6)); then
    log "WARNING: $(step_fmt $SECONDS) is close to or over CI's limit of $(step_fmt $ci_budget_s)"
  fi
  [[ -n $fallback ]] && fallback_banner
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The test command on the host, in this clone: what .ci/run does when the
# fresh root cannot be made here (CXLPOOL_CI_FRESH_ROOT=auto, or =host).
host_run() {
  local rc
  step "host: $test_cmd (NOT in a fresh root)"
  # In the background, so that a signal runs the trap at once (bash defers
  # traps while a foreground child runs); its own group, so the trap can end it.
  set +e
  (cd "$src" && exec setsid bash -c "$test_cmd") &
  host_child=$!
  wait "$host_child"
  rc=$?
  host_child=""
  set -e
  ((rc == 0)) && log "the test command passed on the host" ||
    log "the test command failed on the host (exit $rc)"
  exit $rc
}
# This machine cannot make the root: fail, or run on the host, loudly.
no_root() {  # why
  end_step
  undo_root
  if [[ $mode == require ]]; then
    banner "CANNOT RUN THE TESTS IN A FRESH ROOT: $1" \
      "CXLPOOL_CI_FRESH_ROOT=require: failing. Unset it (or =auto) to run the" \
      "README's test command on the host instead."
    exit 1
  fi
  fallback="cannot make a fresh root here: $1"
  fallback_banner
  host_run
}

bind() {  # src dest
  mkdir -p "$2" && mount --rbind "$1" "$2" || return 1
  mounts+=("$2")
  mount --make-rslave "$2"
}

if [[ $mode == host ]]; then
  fallback="CXLPOOL_CI_FRESH_ROOT=host"
  fallback_banner
  host_run
fi

# ---- can this machine make the root? -------------------------------------------
step "host: preflight (root, mount, disk, mirror)"
[[ $(id -u) -eq 0 ]] || no_root "not running as root (debootstrap, mount and chroot need it)"
probe=$(mktemp -d)
if mount -t tmpfs -o size=1M tmpfs "$probe" 2>/dev/null; then
  umount "$probe"
  rmdir "$probe"
else
  rmdir "$probe"
  no_root "mount is refused (no CAP_SYS_ADMIN: an unprivileged container?)"
fi
mkdir -p "$cache" 2>/dev/null || no_root "cannot create the cache folder $cache"
workdir=${CXLPOOL_CI_WORKDIR:-/var/tmp}
mkdir -p "$workdir" 2>/dev/null || no_root "cannot create $workdir"
need_kb=$((14 * 1024 * 1024))
avail_kb=$(df -Pk "$workdir" | awk 'NR == 2 { print $4 }')
((avail_kb >= need_kb)) ||
  no_root "$((avail_kb / 1024 / 1024)) GiB free in $workdir, the root and its build folders need 14"
# The mirror (or the proxy): install-deps.sh fetches from it inside the root.
hostport=${mirror#*://}
hostport=${hostport%%/*}
proxy=${http_proxy:-${HTTP_PROXY:-}}
if [[ -n $proxy && $mirror == http://* ]]; then
  hostport=${proxy#*://}
  hostport=${hostport%%/*}
  hostport=${hostport##*@}
fi
host=${hostport%:*} port=80
[[ $hostport == *:* ]] && port=${hostport##*:}
[[ $mirror == https://* && $hostport != *:* ]] && port=443
timeout 20 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null ||
  no_root "cannot reach $host:$port (the Debian mirror $mirror${proxy:+ through $proxy}); no network?"
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap on the host"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 &&
      apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1; } ||
    no_root "debootstrap is missing and apt-get cannot install it"
fi

# ---- the base root (cached) ------------------------------------------------------
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
key=$(printf '%s minbase %s %s %s\n' "$suite" "$include" "$mirror" "$arch" |
  sha256sum | cut -c1-12)
base=$cache/$suite-minbase-$key.tar
if [[ -f $base ]] && [[ -n $(find "$base" -mtime +"$max_age" -print) ]]; then
  log "base root older than $max_age days: making it again"
  rm -f "$base"
fi
if [[ ! -f $base ]]; then
  step "base root: debootstrap $suite minbase (+$include)"
  tmp=$(mktemp -d "$cache/.base.XXXXXX")
  if ! debootstrap --variant=minbase --include="$include" "$suite" "$tmp/root" "$mirror" \
    >"$tmp/debootstrap.log" 2>&1; then
    tail -n 20 "$tmp/debootstrap.log" >&2
    umount -R "$tmp/root/proc" "$tmp/root/sys" 2>/dev/null || true
    rm -rf "$tmp"
    no_root "debootstrap $suite from $mirror failed (its log's end is above)"
  fi
  rm -rf "$tmp"/root/var/cache/apt/archives/*.deb
  tar --numeric-owner --xattrs -C "$tmp/root" -cf "$tmp/base.tar" . &&
    mv "$tmp/base.tar" "$base" || { rm -rf "$tmp"; no_root "cannot write the base tarball to $cache"; }
  rm -rf "$tmp"
else
  step "base root: cached $(basename "$base")"
fi

step "root: unpack"
work=$(mktemp -d "$workdir/cxlpool-ci.XXXXXX")
root=$work/root
mkdir -p "$root"
tar --numeric-owner --xattrs -C "$root" -xf "$base" || no_root "cannot unpack $base into $root"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
chroot "$root" /bin/true 2>/dev/null || no_root "chroot into $root is refused (no CAP_SYS_CHROOT?)"

step "root: clean clone of $rev"
commit=$(git -C "$src" rev-parse --verify "$rev^{commit}")
if [[ -n $(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null) && $rev == HEAD ]]; then
  log "note: uncommitted changes in $src are not in the clone"
fi
git clone --quiet --no-hardlinks --no-checkout "$src" "$root/src/cxlpool"
git -C "$root/src/cxlpool" checkout --quiet "$commit"
log "cloned $(git -C "$root/src/cxlpool" log -1 --format='%h %s' | cut -c1-100)"

step "root: mounts"
mkdir -p "$root/proc" "$root/sys" "$root/dev" "$root/run"
mount -t proc proc "$root/proc" || no_root "cannot mount /proc in the root"
mounts+=("$root/proc")
bind /sys "$root/sys" || no_root "cannot bind-mount /sys into the root"
bind /dev "$root/dev" || no_root "cannot bind-mount /dev into the root"  # with /dev/kvm, shm, pts
mount -t tmpfs -o mode=0755 tmpfs "$root/run" || no_root "cannot mount a tmpfs on the root's /run"
mounts+=("$root/run")
if [[ ${CXLPOOL_CI_VM_CACHE:-1} == 1 ]]; then
  mkdir -p "$cache/vm"
  bind "$cache/vm" "$root/root/.cache/cxlpool-vm" || no_root "cannot bind the VM cache"
fi
if [[ ${CXLPOOL_CI_APT_CACHE:-1} == 1 ]]; then
  # Downloads only: every package is still installed into the fresh root.
  mkdir -p "$cache/apt-archives/partial"
  bind "$cache/apt-archives" "$root/var/cache/apt/archives" || no_root "cannot bind the apt cache"
fi
if [[ ${CXLPOOL_CI_CCACHE:-1} == 1 ]]; then
  mkdir -p "$cache/ccache"
  bind "$cache/ccache" "$root/root/.cache/ccache" || no_root "cannot bind the ccache"
fi

# From here on the result is the test command's: no fallback.
step "chroot: $test_cmd"
env_args=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  TERM=dumb LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive)
for v in CXLPOOL_TEST_STAGES CXLPOOL_JOBS CXLPOOL_FUZZ_SECONDS http_proxy https_proxy; do
  [[ -n ${!v:-} ]] && env_args+=("$v=${!v}")
done
# In the background, so that a signal (CI's timeout, Ctrl-C) runs the trap
# at once; the trap ends every process in the root and unmounts.
set +e
chroot "$root" /usr/bin/env -i "${env_args[@]}" /bin/bash -c "cd /src/cxlpool && $test_cmd" &
wait $!
rc=$?
set -e
((rc == 0)) && log "the test command passed in the fresh root" ||
  log "the test command failed in the fresh root (exit $rc)"
exit $rc
}
