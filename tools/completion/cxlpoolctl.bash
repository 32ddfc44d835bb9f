# bash completion for cxlpoolctl. The global options (--socket, --json,
# --version, --help) go before or after the command word.
_cxlpoolctl() {
  local cur prev words cword
  _init_completion || return
  local commands="topology pools leases stats alloc revoke quotas quota metrics doctor"
  local global="--socket --json --version --help"
  case $prev in
    --socket) _filedir; return ;;
    --sysfs-root) _filedir -d; return ;;
    --tier) COMPREPLY=($(compgen -W "dram cxl hbm nvm devdax" -- "$cur")); return ;;
    --size|--node|--near-gpu|--label|--name|--uid|--gid|--cgroup|--max-bytes|--max-leases|--priority|--socket-group)
      return ;;
  esac
  # The command word: the first word that is neither an option nor the
  # value of --socket.
  local i cmd="" cmd_at=0
  for ((i = 1; i < cword; i++)); do
    if [[ ${words[i]} == --socket ]]; then ((i++)); continue; fi
    if [[ ${words[i]} != -* ]]; then cmd=${words[i]}; cmd_at=$i; break; fi
  done
  if [[ -z $cmd ]]; then
    COMPREPLY=($(compgen -W "$commands $global" -- "$cur"))
    return
  fi
  local opts=$global
  case $cmd in
    topology) opts="$opts --sysfs-root --no-nvml" ;;
    leases) opts="$opts --all --mine" ;;
    alloc) opts="$opts --size --node --near-gpu --tier --strict --hugetlb --label --name --hold" ;;
    quota)
      if ((cword == cmd_at + 1)); then opts="set"; else
        opts="$opts --uid --gid --cgroup --tier --max-bytes --max-leases --priority"; fi ;;
    doctor) opts="$opts --sysfs-root --socket-group" ;;
  esac
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -F _cxlpoolctl cxlpoolctl
