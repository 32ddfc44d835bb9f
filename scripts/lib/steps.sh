# shellcheck shell=bash
# Step timing for scripts/test.sh and scripts/ci-fresh-root.sh.
#   step NAME           ends the running step (printing its time), starts NAME
#   end_step            ends the running step
#   step_summary RC     every step's time and the total (and FAILED when RC != 0)
# Lines go through step_say, which a script may define before sourcing this
# (default: "==== TEXT" on stdout).
step_times=() step_name="" step_start=0
declare -F step_say >/dev/null || step_say() { echo "==== $*"; }
step_fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
end_step() {
  [[ -n $step_name ]] || return 0
  local d=$((SECONDS - step_start))
  step_times+=("$(printf '%-44s %s' "$step_name" "$(step_fmt $d)")")
  step_say "$step_name: $(step_fmt $d)"
  step_name=""
}
step() {
  end_step
  step_name=$1 step_start=$SECONDS
  step_say "---- $1 ($(date +%T))"
}
step_summary() {
  local rc=${1:-0} t
  end_step
  step_say "step times (total $(step_fmt $SECONDS))$( ((rc)) && echo ", FAILED (exit $rc)")"
  for t in "${step_times[@]}"; do step_say "  $t"; done
}
