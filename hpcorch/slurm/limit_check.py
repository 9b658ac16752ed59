"""Slurm's limits checked at submission: a job whose minimum no limit allows is refused
with one line naming the limit, before anything is written or submitted.

``hpcorch submit`` reads the limits that would bind the job (``scontrol show assoc_mgr``
for the submitting user, and the partitions: 2 Slurm calls), as the controller does
(:mod:`hpcorch.slurm.limits`), and refuses a job that can never run within them: a
minimum of GPUs, nodes or CPUs above a per-job limit (``MaxTRESPerJob``, an
association's ``MaxTRES``, a partition's ``MaxNodes``), above a limit of its user's or
account's jobs together (``MaxTRESPerUser``, ``GrpTRES``: with none of their other jobs
running it still would not fit), a count of submitted jobs at ``MaxSubmitJobs``, or (sent
straight to Slurm) a time limit above ``MaxWall`` or the partition's ``MaxTime``; in the
pool each launch keeps to those, so there a longer time limit is only said. Where the
limits cannot be read (no accounting), Slurm decides alone.

The job's QOS is the one it names, else ``normal`` where it exists (the QOS slurmdbd
gives an association by default); its account the one it names, else the user's default.
"""

from __future__ import annotations

import math
import os
import pwd
from collections.abc import Callable

from hpcorch.errors import HpcorchError, SubmitError
from hpcorch.limits import Cap
from hpcorch.slurm.assoc_mgr import AssocMgr, Partition
from hpcorch.slurm.backend import SlurmBackend
from hpcorch.slurm.limits import caps_of
from hpcorch.timefmt import DurationError, fmt_duration, parse_duration

ADVICE = "ask for less, or another QOS or account"


def check_limits(
    backend: SlurmBackend,
    min_gpus: int,
    gpus_per_node: int,
    cpus_per_gpu: int,
    partition: str,
    account: str | None,
    qos: str | None,
    time_limit: str | None,
    pool: bool,
    note: Callable[[str], None],
) -> None:
    """Raise :class:`SubmitError` naming the limit that no launch of the job could keep
    to (see the module); ``note``: where a longer time limit than the pool's launches may
    have is said."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        return
    read = getattr(backend, "limits", None)  # (a backend of an older interface: none)
    if read is None:
        return
    try:
        mgr, parts = read([user])
    except HpcorchError:
        return  # Slurm decides alone
    caps = job_caps(mgr, parts, user, uid, account, qos, partition)
    problem = refusal_of(caps, min_gpus, gpus_per_node, cpus_per_gpu)
    if problem:
        raise SubmitError(problem)
    minutes = _minutes(time_limit)
    walls = [(c.wall_min, c) for c in caps if c.wall_min is not None]
    if minutes is None or not walls:
        return
    wall, cap = min(walls, key=lambda w: w[0] or 0)
    if wall is not None and minutes > wall:
        shown = f"--time {time_limit} is over {cap.describe()}"
        if not pool:
            raise SubmitError(f"{shown}: ask for --time {fmt_duration(wall * 60)} or less")
        note(
            f"note: {shown}: each launch runs at most {fmt_duration(wall * 60)}, then "
            "checkpoints and is relaunched"
        )


def job_caps(
    mgr: AssocMgr,
    parts: dict[str, Partition],
    user: str,
    uid: int,
    account: str | None,
    qos: str | None,
    partition: str,
) -> list[Cap]:
    """The caps on a job of ``user`` (its account and QOS as the module says)."""
    acct = account or mgr.default_account.get(user, "")
    q = qos or ("normal" if "normal" in mgr.qos else "")
    return caps_of(mgr, parts, user, uid, acct, q, partition)


def refusal_of(caps: list[Cap], min_gpus: int, gpus_per_node: int, cpus_per_gpu: int) -> str:
    """Why a job of at least ``min_gpus`` can never run within ``caps`` ('' if it can)."""
    per_node = gpus_per_node
    for c in caps:
        if c.per_job and c.per_node.gpus is not None:
            per_node = min(per_node, c.per_node.gpus)
        if c.per_job and c.per_node.cpus is not None and cpus_per_gpu > 0:
            per_node = min(per_node, c.per_node.cpus // cpus_per_gpu)
    if per_node < 1:
        which = [c for c in caps if c.per_job and c.per_node.any()]
        what = which[0].describe() if which else "its limits"
        return f"--min-gpus {min_gpus}: {what} leaves no GPU on a node ({ADVICE})"
    nodes = math.ceil(min_gpus / per_node)
    for c in caps:
        gpus, count, cpus = c.limit.gpus, c.limit.nodes, c.limit.cpus
        kind = "per job" if c.per_job else "for its jobs together"
        if gpus is not None and gpus < min_gpus:
            return f"--min-gpus {min_gpus}: {c.describe()} allows {gpus} GPUs {kind} ({ADVICE})"
        if c.per_job and count is not None and count < nodes:
            return (
                f"--min-gpus {min_gpus} needs {nodes} nodes: {c.describe()} allows {count} "
                f"({ADVICE})"
            )
        if cpus is not None and cpus_per_gpu > 0 and cpus < min_gpus * cpus_per_gpu:
            return (
                f"--min-gpus {min_gpus} at {cpus_per_gpu} CPUs per GPU: {c.describe()} "
                f"allows {cpus} CPUs {kind} ({ADVICE})"
            )
        if not c.per_job and c.limit.jobs == 0:
            return f"{c.describe()} allows no running job ({ADVICE})"
        if c.submit is not None and c.submitted >= c.submit:
            return (
                f"{c.describe()}: {c.submitted} jobs submitted, MaxSubmitJobs {c.submit} "
                "(wait for one to end)"
            )
    return ""


def _minutes(time_limit: str | None) -> int | None:
    if not time_limit:
        return None
    try:
        seconds = parse_duration(time_limit)
    except DurationError:
        return None
    return None if seconds is None else math.ceil(seconds / 60)
