"""What the simulated Slurm shows of a job (squeue's view of it) and where a released
launch fits on the free GPUs (:class:`hpcorch.sim.slurm_side.SimSlurm`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from hpcorch.cluster import ObservedJob, Shape
from hpcorch.sim.slurm_jobs import SlurmJob


def observed(j: SlurmJob, node_names: Sequence[str], admin_held: Collection[int]) -> ObservedJob:
    """``j`` as squeue shows it (``admin_held``: the jobs under an operator's hold)."""
    running = j.state == "RUNNING" or j.ended
    return ObservedJob(
        slurm_id=j.slurm_id,
        name=j.model.spec.name,
        user=j.user,
        state=j.state,
        held=j.held,
        reason=(
            ("JobHeldAdmin" if j.slurm_id in admin_held else "JobHeldUser")
            if j.held
            else ("" if running else j.refused or "Resources")
        ),
        node_names=tuple(node_names[i] for i in j.nodes) if running else (),
        gpus_per_node=max(j.counts, default=0) if running else 0,
        restarts=j.restarts,
        exit_code=j.exit_code,
        submit_time=j.model.spec.time,
        start_time=j.start_time,
        tags=j.tags,
        end_time=j.end_time,
        per_node=j.counts if running else (),
        special_exit=j.special_exit,
    )


def cpus_per_gpu(
    shape: Shape,
    nodes: tuple[int, ...],
    node_cpus: Sequence[int],
    node_gpus: Sequence[int],
    fixed_cpus: int,
) -> int:
    """The CPUs with each GPU of a launch on ``nodes``: the fixed count, the shape's, else
    the site default (node CPUs / node GPUs); 0 where CPUs are not modelled."""
    if not node_cpus:
        return 0
    if fixed_cpus or shape.cpus_per_gpu:
        return fixed_cpus or shape.cpus_per_gpu
    return min(node_cpus[i] // max(node_gpus[i], 1) for i in nodes)


def fit_shape(
    shape: Shape,
    free: Sequence[int],
    index: Mapping[str, int],
    type_of: Callable[[int], str],
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(nodes, GPUs on each) for ``shape`` on the ``free`` GPUs of each node, or None.
    ``index``: each node name's index; ``type_of``: a node's GPU type ("": one type)."""
    if shape.node_names:
        idx = tuple(index[n] for n in shape.node_names)
        counts = shape.per_node or (shape.gpus_per_node,) * len(idx)
        if all(free[i] >= c for i, c in zip(idx, counts, strict=True)):
            return idx, counts
        return None
    per, kind = shape.gpus_per_node, shape.gpu_type
    fits = sorted(
        (i for i, f in enumerate(free) if f >= per and kind in ("", type_of(i))),
        key=lambda i: (free[i], i),
    )
    if len(fits) < shape.nodes:
        return None
    return tuple(sorted(fits[: shape.nodes])), (per,) * shape.nodes
