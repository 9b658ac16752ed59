"""Where a start goes, and when: the launch shape of a job's target and the waits before a
start is handed to the cluster (a relaunch until slurmd let go of the last run; an uneven
placement until the free GPUs leave its split). Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hpcorch.cluster import PoolNode, Shape, fill_gpus
from hpcorch.controller.actions import Settings
from hpcorch.controller.store import JobRecord


def target_shape(rec: JobRecord, pool_nodes: tuple[str, ...]) -> Shape:
    """The launch shape for the record's target: exactly the planned placement (its GPUs on
    each planned node, the nodes in rank order) when it is known and every planned node
    exists; else the fewest even nodes for Slurm to choose. Of the GPU type the plan chose
    (``rec.target_type``; '': any)."""
    placement = rec.placement()
    if placement and all(0 <= i < len(pool_nodes) for i in placement):
        names = tuple(pool_nodes[i] for i in placement)
        counts = tuple(placement.values())
        return Shape(len(names), max(counts), names, rec.target_cpus, counts, rec.target_type)
    per_node = max(placement.values()) if placement else rec.target_gpus
    for nodes in range(1, rec.target_gpus + 1):
        if rec.target_gpus % nodes == 0 and rec.target_gpus // nodes <= max(per_node, 1):
            return Shape(
                nodes, rec.target_gpus // nodes, (), rec.target_cpus, gpu_type=rec.target_type
            )
    return Shape(rec.target_gpus, 1, (), rec.target_cpus, gpu_type=rec.target_type)


def start_claims(
    records: Sequence[JobRecord], pool_nodes: tuple[str, ...]
) -> dict[int, dict[str, int]]:
    """The GPUs each starting job is to take on each node, where its plan names them."""
    out: dict[int, dict[str, int]] = {}
    for r in records:
        if r.phase == "starting" and r.target_gpus > 0:
            shape = target_shape(r, pool_nodes)
            if shape.per_node:
                out[r.slurm_id] = dict(zip(shape.node_names, shape.per_node, strict=True))
    return out


def blocked_starts(records: Sequence[JobRecord], nodes: Sequence[PoolNode]) -> dict[int, str]:
    """Starting jobs whose planned GPUs running jobs hold (Slurm placed one of them
    otherwise than planned, or it ran on there longer): {job id: why}. Waiting cannot
    free those GPUs; the job is to be planned afresh. GPUs in use that no job Slurm lists
    accounts for (``PoolNode.gpus_residue``) block no start: as a rule they are the start
    itself, or a job ending, caught between Slurm's two reads (when slurmctld answers
    slowly, across cycles), and a start held for them would already run unplanned. A start
    they do hold back stays pending in Slurm and is planned again past
    ``Settings.launch_pending_s``."""
    names = tuple(n.name for n in nodes)
    free = {
        n.name: max(0, n.gpus - n.gpus_foreign + n.gpus_residue) if n.usable else 0 for n in nodes
    }
    unusable = {n.name: n.leaving or "down" for n in nodes if not n.usable}
    holders: dict[str, list[str]] = {}
    for r in records:
        if r.phase != "running" or not r.gpus:
            continue
        where = [n for n in r.node_list.split(",") if n]
        counts = [int(c) for c in r.node_gpus.split(",") if c.isdigit()]
        if len(counts) != len(where):
            counts = [r.gpus // max(1, len(where))] * len(where)
        for name, c in zip(where, counts, strict=True):
            if name in free:
                free[name] -= c
                holders.setdefault(name, []).append(f"{r.slurm_id}:{c}")
    out: dict[int, str] = {}
    for sid, claim in start_claims(records, names).items():
        short = {n: c for n, c in claim.items() if free.get(n, 0) < c}
        if short:
            gone = {n: why for n, why in unusable.items() if n in short}
            what = "; ".join(
                f"{n}: out of service ({gone[n]})"
                if n in gone
                else f"{n}: {max(0, free.get(n, 0))} of {c} free, jobs "
                + " ".join(holders.get(n, []))
                for n, c in short.items()
            )
            held = "are out of service or held" if gone else "are held"
            out[sid] = f"its planned GPUs {held} by running jobs ({what}): planned again"
        for n, c in claim.items():
            free[n] = free.get(n, 0) - c
            holders.setdefault(n, []).append(f"{sid}:{c} (starting)")
    return out


def start_wait(
    rec: JobRecord,
    shape: Shape,
    nodes: Sequence[PoolNode],
    now: float,
    s: Settings,
    claims: Mapping[int, Mapping[str, int]] | None = None,
) -> str:
    """Why a start must wait ('' = go now): a relaunch until the second after its last
    run was seen ending (``Settings.relaunch_delay_s``), an uneven shape until the free
    GPUs leave its split (:func:`launch_wait`; ``claims``: :func:`start_claims`)."""
    ran = rec.launches or rec.failures or rec.slurm_restarts  # a run ended before this start
    if ran and now < math.floor(rec.phase_since) + s.relaunch_delay_s:
        return "relaunching once slurmd has let go of the last run"
    others: dict[str, int] = {}
    first = True  # no start with a lower id is to share a node with it
    for sid, claim in (claims or {}).items():
        for node, n in claim.items():
            if sid != rec.slurm_id:
                others[node] = others.get(node, 0) + n
                first &= not (sid < rec.slurm_id and node in shape.node_names)
    return launch_wait(shape, nodes, now - rec.phase_since, s.exact_wait_s, others, first)


def launch_wait(
    shape: Shape,
    nodes: Sequence[PoolNode],
    waited_s: float = 0.0,
    limit_s: float = 0.0,
    claimed: Mapping[str, int] | None = None,
    first: bool = False,
) -> str:
    """Why an uneven launch must wait before it is handed to the cluster ('' = go now).

    An even shape is held to its count on every node by Slurm itself. An uneven one is
    one GPU count on its nodes, which the cluster spreads by :func:`fill_gpus`; released
    while its nodes' free GPUs allow another split, it would start at once with that
    split (or before a stopping job has freed the planned GPUs). So it waits until the
    free GPUs leave exactly the planned split. When the planned GPUs are free and the
    nodes' other free GPUs are ones no other starting job is to take (``claimed``: GPUs
    per node name; the plan leaves them idle), waiting cannot help: it goes with the split
    the cluster chooses on the same nodes. After ``limit_s`` (``waited_s`` so far) it also
    goes where the cluster's split takes GPUs the plan left idle but none another
    starting job is to take; never the others' (that job would then wait for GPUs that do
    not come back: a start held back too long is planned afresh by the loop), unless it is
    ``first``: no start with a lower id is to share its nodes. Starts whose splits
    interleave would otherwise each wait for the other to take its GPUs first, planned
    afresh the same way every ``launch_pending_s`` (seen at the end of a 2,000-job run);
    the first goes, and a start whose GPUs it took is found blocked and planned again."""
    if shape.even or len(shape.per_node) != len(shape.node_names):
        return ""
    order = {n.name: i for i, n in enumerate(nodes)}
    free = {n.name: max(0, n.gpus - n.gpus_used) if n.usable else 0 for n in nodes}
    mine = sorted(
        zip(shape.node_names, shape.per_node, strict=True),
        key=lambda p: order.get(p[0], len(order)),
    )
    have_free = [free.get(name, 0) for name, _ in mine]
    planned = tuple(c for _, c in mine)
    if fill_gpus(shape.gpus, have_free) == planned:
        return ""
    if all(f >= c for f, c in zip(have_free, planned, strict=True)):  # the planned GPUs are free
        others = claimed or {}
        if not any(
            f > c and others.get(name, 0) > 0 for (name, c), f in zip(mine, have_free, strict=True)
        ):
            return ""
        split = fill_gpus(shape.gpus, have_free)
        if (
            waited_s >= limit_s > 0
            and split is not None
            and all(
                s - c <= f - c - others.get(name, 0)
                for (name, c), f, s in zip(mine, have_free, split, strict=True)
            )
        ):
            return ""  # Slurm's split takes more here, but none of what others are to take
        if waited_s >= limit_s > 0 and first and split is not None:
            return ""  # the first of starts that would wait for each other
    have = " ".join(f"{name}:{free.get(name, 0)}" for name, _ in mine)
    want = " ".join(f"{name}:{c}" for name, c in mine)
    return f"waiting until the free GPUs ({have}) leave one split: {want}"
