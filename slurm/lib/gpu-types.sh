# slurm/lib/gpu-types.sh: a local pool of several GPU types (`slurm/pool up --gpu-types`),
# sourced by slurm/pool, whose settings (gpu_types, nodes, prefix, digits, port_base, cpus,
# mem_mb, gpus, dir) and helpers (die, node_name) it uses.

# --gpu-types: one NodeName line per type in slurm.conf and gres.conf, in place of the
# template's one line for every node (each slurmd keeps its port: port base + 100 + index)
typed_nodes() {
  local host=$1 gpu_last=$2 spec t n first=1 last names ports node_lines="" gres_lines=""
  local specs
  IFS=, read -ra specs <<<"$gpu_types"
  for spec in "${specs[@]}"; do
    t=${spec%%:*} n=${spec#*:}
    last=$((first + n - 1))
    if ((n == 1)); then
      names=$(node_name "$first") ports=$((port_base + 100 + first))
    else
      names="$prefix[$(printf '%0*d' "$digits" "$first")-$(printf '%0*d' "$digits" "$last")]"
      ports="[$((port_base + 100 + first))-$((port_base + 100 + last))]"
    fi
    node_lines+="NodeName=$names NodeHostname=$host NodeAddr=127.0.0.1 Port=$ports CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$t:$gpus Feature=$t State=UNKNOWN"$'\n'
    gres_lines+="NodeName=$names Name=gpu Type=$t File=$dir/dev/gpu[0-$gpu_last]"$'\n'
    first=$((last + 1))
  done
  local f
  for f in "$dir/etc/slurm.conf.tmp" "$dir/etc/gres.conf"; do
    local lines=$node_lines
    [[ $f == */gres.conf ]] && lines=$gres_lines
    awk -v lines="$lines" '/^NodeName=/ { if (!done) printf "%s", lines; done = 1; next } { print }' \
      "$f" >"$f.typed" && mv "$f.typed" "$f"
  done
}

# --gpu-types T:N,...: lowercase type names, positive counts adding up to the nodes
check_gpu_types() {
  local spec sum=0 specs seen=" "
  IFS=, read -ra specs <<<"$gpu_types"
  ((${#specs[@]} >= 1)) || die "--gpu-types needs TYPE:NODES[,TYPE:NODES...], got '$gpu_types'"
  for spec in "${specs[@]}"; do
    [[ $spec =~ ^([a-z][a-z0-9_]{0,15}):([1-9][0-9]{0,1})$ ]] ||
      die "--gpu-types needs TYPE:NODES[,TYPE:NODES...] (a type: a lowercase letter, then up to 15 lowercase letters, digits or _), got '$spec'"
    [[ $seen != *" ${BASH_REMATCH[1]} "* ]] || die "--gpu-types names type '${BASH_REMATCH[1]}' twice"
    seen+="${BASH_REMATCH[1]} "
    sum=$((sum + BASH_REMATCH[2]))
  done
  ((sum == nodes)) || die "--gpu-types gives $sum nodes, the pool has $nodes (--nodes)"
}
