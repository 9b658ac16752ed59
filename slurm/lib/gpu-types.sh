# slurm/lib/gpu-types.sh: a local pool of several GPU types (`slurm/pool up --gpu-types`),
# sourced by slurm/pool, whose settings (gpu_types, nodes, port_base, dir) and helpers
# (die, node_range) it uses.

# --gpu-types: the template's NodeName line of slurm.conf and of gres.conf, rendered for
# every node, becomes one line per type: its nodes, their slurmd ports (port base + 100 +
# index), and the type (Gres=gpu:T:G Feature=T; Type=T)
typed_nodes() {
  local f line out spec t n first last specs
  IFS=, read -ra specs <<<"$gpu_types"
  for f in "$dir/etc/slurm.conf.tmp" "$dir/etc/gres.conf"; do
    line=$(grep -m 1 '^NodeName=' "$f")
    out="" first=1
    for spec in "${specs[@]}"; do
      t=${spec%%:*} n=${spec#*:}
      last=$((first + n - 1))
      local ports="[$((port_base + 100 + first))-$((port_base + 100 + last))]"
      ((n == 1)) && ports=$((port_base + 100 + first))
      out+=$(sed -E -e "s/^NodeName=[^ ]+/NodeName=$(node_range "$first" "$last")/" \
        -e "s/ Port=[^ ]+/ Port=$ports/" -e "s/ Gres=gpu:([0-9]+)/ Gres=gpu:$t:\1 Feature=$t/" \
        -e "s/ Name=gpu / Name=gpu Type=$t /" <<<"$line")$'\n'
      first=$((last + 1))
    done
    awk -v lines="$out" '/^NodeName=/ { if (!done) printf "%s", lines; done = 1; next } { print }' \
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
