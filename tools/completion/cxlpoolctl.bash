# bash completion for cxlpoolctl
_cxlpoolctl() {
  local cur prev words cword
  _init_completion || return
  local commands="topology pools leases stats alloc revoke quotas quota metrics doctor"
  if [[ $cword -eq 1 ]]; then
    COMPREPLY=($(compgen -W "$commands --help" -- "$cur"))
    return
  fi
  case $prev in
    --socket) _filedir; return ;;
    --sysfs-root) _filedir -d; return ;;
    --tier) COMPREPLY=($(compgen -W "dram cxl hbm nvm" -- "$cur")); return ;;
    --size|--node|--near-gpu|--label|--name|--uid|--gid|--cgroup|--max-bytes|--max-leases|--priority|--socket-group)
      return ;;
  esac
  local opts="--json --socket --help"
  case ${words[1]} in
    topology) opts="--json --sysfs-root --no-nvml --help" ;;
    leases) opts="$opts --all --mine" ;;
    alloc) opts="$opts --size --node --near-gpu --tier --strict --hugetlb --label --name --hold" ;;
    quota)
      if [[ $cword -eq 2 ]]; then opts="set"; else
        opts="$opts --uid --gid --cgroup --tier --max-bytes --max-leases --priority"; fi ;;
    metrics) opts="--socket --help" ;;
    doctor) opts="$opts --sysfs-root --socket-group" ;;
  esac
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -F _cxlpoolctl cxlpoolctl
