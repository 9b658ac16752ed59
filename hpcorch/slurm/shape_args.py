"""The ``scontrol update job`` fields that give a pending job its next launch's shape
(hpcorch/slurm/backend.py's ``set_shape``)."""

from __future__ import annotations

from collections.abc import Sequence

from hpcorch.gputypes import TYPE_RE

__all__ = ["shape_args"]


def shape_args(
    nodes: int,
    gpus_per_node: int,
    node_names: Sequence[str] = (),
    cpus_per_gpu: int = 0,
    per_node: Sequence[int] = (),
    gpu_type: str = "",
) -> list[str]:
    """``scontrol update job`` fields for a pending job's next launch.

    ``gpu_type``: the GPUs are of that type (``gres:gpu:a100:4``); '' any GPUs, which also
    clears a type an earlier launch asked for.

    The same GPUs on every node: ``TresPerNode``, which Slurm holds to on each node.
    Different counts (``per_node`` on ``node_names``): one GPU count for the whole job
    (``TresPerJob``, i.e. ``--gpus``) on exactly those nodes; Slurm 22.05+ puts one GPU on
    every node and the rest node by node in its node order, each up to the node's free
    GPUs (``hpcorch.cluster.fill_gpus``), so the counts are exactly ``per_node`` when the
    free GPUs leave that one choice, which the controller waits for. The other form is
    cleared, so a job can go from one to the other between launches.

    CPUs: never ``CpusPerTres``. It does not change the CPUs of an allocation after submit
    on 22.05 (a job submitted with 2 CPUs per GPU on 1 GPU got 2 CPUs on 4 GPUs), and
    24.11+ keeps the CPUs it implied at a job's first scheduling through every later update
    (a job started at 4 GPUs x 2 CPUs and reshaped to 2 GPUs still needed 8 CPUs on 4
    cores: pending for Resources on an idle node). The job's CPUs are its per-node minimum
    ``MinCPUsNode`` (the GPUs' CPUs on each node) and its total ``NumCPUs``. For an uneven
    job Slurm spreads the total over its nodes itself, evenly (3 and 3 for 4+2 GPUs at 1
    per GPU), whatever the per-node minimum: a total planned as the GPUs' CPUs put more on
    the node with the fewest GPUs than the plan left free there (3+4+4 GPUs at 2 per GPU:
    22 CPUs, 7 on a node with 6 free, pending for Resources while its GPUs sat idle; the
    real-pool replay). So an uneven job asks for the CPUs of its leanest node on every
    node (2 x 3 = 6 there, 18 in all): it fits wherever its GPUs were planned, and the job
    wrapper gives every task the CPUs per GPU of the leanest node.
    """
    counts = tuple(per_node) if per_node else (gpus_per_node,) * nodes
    uneven = len(set(counts)) > 1
    if gpu_type and not TYPE_RE.fullmatch(gpu_type):
        raise ValueError(f"not a GPU type: {gpu_type!r}")
    gpu = f"gres:gpu:{gpu_type}:" if gpu_type else "gres:gpu:"
    if uneven:
        gres = ["TresPerNode=", f"TresPerJob={gpu}{sum(counts)}"]
    else:
        gres = ["TresPerJob=", f"TresPerNode={gpu}{gpus_per_node}"]
    cpus = []
    if cpus_per_gpu > 0:
        least = cpus_per_gpu * min(counts)
        total = least * len(counts) if uneven else cpus_per_gpu * sum(counts)
        cpus = [f"MinCPUsNode={max(1, least)}", f"NumCPUs={total}"]
    return [f"NumNodes={nodes}-{nodes}", *gres, *cpus, f"ReqNodeList={','.join(node_names)}"]
