"""The view behind ``hpcorch status``: Slurm's jobs and nodes in, rows and text out. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hpcorch.gputypes import GpuTypeError, parse_tag, type_of_nodes
from hpcorch.hostlist import expand
from hpcorch.slurm.parse import SlurmJob, SlurmNode
from hpcorch.slurm.script import parse_comment
from hpcorch.status_format import (
    COMPACT_STATES,
    STATUS_VERSION,
    Field,
    FormatError,
    parse_format,
    render_rows,
    render_table,
)
from hpcorch.timefmt import fmt_duration

__all__ = [
    "COMPACT_STATES",
    "FormatError",
    "JobRow",
    "Managed",
    "PoolRow",
    "fmt_duration",
    "job_rows",
    "parse_format",
    "pool_rows",
    "render_status",
    "render_table",
    "status_document",
]


@dataclass(frozen=True)
class JobRow:
    job_id: int
    job_key: str
    name: str
    user: str
    state: str
    gpus: int
    min_gpus: int
    max_gpus: int
    global_batch: int | None
    restarts: int
    run_time_s: int
    nodes: str
    reason: str
    phase: str = ""
    """The controller's phase of the job, when a controller manages it ("" otherwise)."""
    micro_batch: int = 0
    accum_steps: int = 0
    samples_per_s: float = 0.0
    mode: str = "managed"
    """managed (the script uses the runtime) or sidecar; "(detected)" when found at launch."""
    lost_steps: int = 0
    account: str = ""
    qos: str = ""
    partition: str = ""
    time_limit_s: int | None = None
    """Slurm's time limit of each launch (None: UNLIMITED)."""
    gpu_type: str = ""
    """The GPU type of the nodes it runs on ("a100+v100" across two; "" untyped or not
    running)."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types it accepts (``submit --gpu-types``; empty: any)."""

    def type_text(self) -> str:
        """The TYPE column: where it runs; for a job not running, what it accepts."""
        if self.state != "PENDING" and self.gpu_type:
            return self.gpu_type
        if self.state == "PENDING":
            return "|".join(self.gpu_types) or "any"
        return "-"

    def batch_text(self) -> str:
        if not self.global_batch:
            return "-"
        if self.micro_batch and self.gpus:
            return f"{self.global_batch}={self.micro_batch}x{self.accum_steps}x{self.gpus}"
        return str(self.global_batch)


@dataclass(frozen=True)
class Managed:
    """What the controller adds to a job's row."""

    phase: str
    reason: str
    global_batch: int
    micro_batch: int
    accum_steps: int
    samples_per_s: float
    restarts: int
    mode: str = "managed"
    lost_steps: int = 0
    gpu_type: str = ""
    """The GPU type of its running (or last) launch, as the controller saw its nodes."""


@dataclass(frozen=True)
class PoolRow:
    node: str
    state: str
    gpus: int
    gpus_busy: int
    gpu_type: str = ""
    """The node's GPU type (``Gres=gpu:a100:4``), "" when untyped."""


def _int(fields: dict[str, str], key: str) -> int | None:
    """A tag of the comment as a number, None unless 1-9 ASCII digits (a user writes it)."""
    value = fields.get(key, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None


def job_rows(
    jobs: Sequence[SlurmJob],
    now: int,
    user: str | Sequence[str] | None = None,
    managed: Mapping[int, Managed] | None = None,
    job_ids: Sequence[int] = (),
    states: Sequence[str] = (),
    phases: Sequence[str] = (),
    names: Sequence[str] = (),
    node_types: Mapping[str, str] | None = None,
) -> list[JobRow]:
    """hpcorch's jobs (marked by their comment), oldest first; filtered, as squeue's
    -u/-j/-t/-n do, by users, job ids, Slurm states (names or squeue's short codes),
    controller phases and job names (each filter: any of its values). ``node_types``: the
    GPU type of each node by name, for the type of a job no controller reports."""
    managed = managed or {}
    users = [user] if isinstance(user, str) else list(user or ())
    wanted_states = {COMPACT_STATES.get(s.upper(), s.upper()) for s in states}
    rows = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        fields = parse_comment(job.comment)
        if fields is None or (users and job.user not in users):
            continue
        if (job_ids and job.job_id not in job_ids) or (names and job.name not in names):
            continue
        if wanted_states and job.state not in wanted_states:
            continue
        if phases and (managed[job.job_id].phase if job.job_id in managed else "") not in phases:
            continue
        started = job.start_time if job.state not in ("PENDING",) else 0
        ended = job.end_time if job.end_time and job.state not in ("RUNNING",) else now
        m = managed.get(job.job_id)
        rows.append(
            JobRow(
                job_id=job.job_id,
                job_key=fields.get("id", ""),
                name=job.name,
                user=job.user,
                state=job.state,
                gpus=job.gpus,
                min_gpus=_int(fields, "min") or job.gpus,
                max_gpus=_int(fields, "max") or job.gpus,
                global_batch=(m.global_batch if m and m.global_batch else _int(fields, "batch")),
                restarts=job.restarts,
                run_time_s=max(0, ended - started) if started else 0,
                nodes=job.nodes,
                reason=m.reason if m and m.reason else job.reason,
                phase=m.phase if m else "",
                micro_batch=m.micro_batch if m else 0,
                accum_steps=m.accum_steps if m else 0,
                samples_per_s=m.samples_per_s if m else 0.0,
                mode=m.mode if m else fields.get("mode", "managed"),
                lost_steps=m.lost_steps if m else 0,
                account=job.account,
                qos=job.qos,
                partition=job.partition,
                time_limit_s=job.time_limit_min * 60 if job.time_limit_min else None,
                gpu_type=_type_of(job, m, node_types or {}),
                gpu_types=_accepted(fields),
            )
        )
    return rows


def _type_of(job: SlurmJob, m: Managed | None, node_types: Mapping[str, str]) -> str:
    if job.state == "PENDING":
        return ""
    if m is not None and m.gpu_type:
        return m.gpu_type
    if not node_types or not job.nodes:
        return ""
    try:
        return type_of_nodes(expand(job.nodes), node_types)
    except ValueError:
        return ""


def _accepted(fields: Mapping[str, str]) -> tuple[str, ...]:
    """The comment's ``types=`` (its owner can rewrite it: () when malformed)."""
    try:
        return parse_tag(fields.get("types"))
    except GpuTypeError:
        return ()


def pool_rows(nodes: Sequence[SlurmNode], partition: str | None = None) -> list[PoolRow]:
    return [
        PoolRow(n.name, "+".join(s.lower() for s in n.states), n.gpus, n.gpus_used, n.gpu_type)
        for n in sorted(nodes, key=lambda n: (len(n.name), n.name))
        if n.gpus and (partition is None or partition in n.partitions)
    ]


def _gpus(j: JobRow) -> str:
    return str(j.gpus) if j.state != "PENDING" else "0"


def _reason_list(j: JobRow) -> str:
    return f"({j.reason})" if j.state == "PENDING" else j.nodes


_F = Field[JobRow]
COMPACT_OF = {v: k for k, v in COMPACT_STATES.items()}
JOB_FIELDS: dict[str, Field[JobRow]] = {
    f.name: f
    for f in (
        _F("jobid", "JOBID", lambda j: str(j.job_id), "i"),
        _F("name", "NAME", lambda j: j.name, "j"),
        _F("user", "USER", lambda j: j.user, "u"),
        _F("account", "ACCOUNT", lambda j: j.account or "-", "a"),
        _F("qos", "QOS", lambda j: j.qos or "-", "q"),
        _F("partition", "PARTITION", lambda j: j.partition, "P"),
        _F("mode", "MODE", lambda j: j.mode),
        _F("state", "STATE", lambda j: j.state, "T"),
        _F("statecompact", "ST", lambda j: COMPACT_OF.get(j.state, j.state), "t"),
        _F("phase", "PHASE", lambda j: j.phase.upper() if j.phase else "-"),
        _F("gpus", "GPUS", _gpus, "b"),
        _F("gputype", "TYPE", JobRow.type_text),
        _F("range", "MIN-MAX", lambda j: f"{j.min_gpus}-{j.max_gpus}"),
        _F("batch", "BATCH", JobRow.batch_text),
        _F("restarts", "RESTARTS", lambda j: str(j.restarts)),
        _F("time", "TIME", lambda j: fmt_duration(j.run_time_s), "M"),
        _F("timelimit", "TIME_LIMIT", lambda j: fmt_duration(j.time_limit_s), "l"),
        _F("samples", "SAMPLES/S", lambda j: f"{j.samples_per_s:.0f}" if j.samples_per_s else "-"),
        _F("nodelist", "NODELIST", lambda j: j.nodes if j.state != "PENDING" else "-", "N"),
        _F("reason", "REASON", lambda j: j.reason, "r"),
        _F("reasonlist", "NODELIST(REASON)", _reason_list, "R"),
        _F("key", "KEY", lambda j: j.job_key),
    )
}
"""Every column ``status -o`` can show, by name (and squeue's letter, where it has one)."""
DEFAULT_FIELDS = (
    "jobid,name,user,mode,state,phase,gpus,range,batch,restarts,time,timelimit,reasonlist"
)
MANAGED_FIELDS = (
    "jobid,name,user,mode,state,phase,gpus,range,batch,restarts,time,timelimit,samples,"
    "nodelist,reason"
)


def render_pool(pool: Sequence[PoolRow]) -> str:
    total = sum(p.gpus for p in pool)
    busy = sum(p.gpus_busy for p in pool)
    out = [f"POOL  {len(pool)} nodes, {total} GPUs: {busy} busy, {total - busy} free"]
    if pool and any(p.gpu_type for p in pool):  # a pool of GPU types: a column for them
        out.append(
            render_table(
                ["NODE", "STATE", "TYPE", "GPUS", "BUSY"],
                [[p.node, p.state, p.gpu_type or "-", str(p.gpus), str(p.gpus_busy)] for p in pool],
            )
        )
    elif pool:
        out.append(
            render_table(
                ["NODE", "STATE", "GPUS", "BUSY"],
                [[p.node, p.state, str(p.gpus), str(p.gpus_busy)] for p in pool],
            )
        )
    return "\n".join(out)


def render_foreign(rows: Sequence[Mapping[str, Any]]) -> str:
    """Jobs on the pool's nodes the controller did not place (its state's ``foreign``):
    counted as taken, never planned; '' when there are none."""
    if not rows:
        return ""
    table = []
    for r in rows:
        nodes = [str(n) for n in r.get("nodes") or []]
        gpus = [int(g) for g in r.get("gpus") or [] if isinstance(g, int)]
        where = " ".join(f"{n}:{g}" for n, g in zip(nodes, gpus, strict=False)) or "-"
        table.append(
            [
                str(r.get("id") or "-"),
                str(r.get("user", "?"))[:32],
                str(r.get("name", ""))[:40],
                str(r.get("state", "")),
                str(sum(gpus)),
                where,
            ]
        )
    head = f"NOT PLACED BY THE CONTROLLER  {len(rows)} job(s): their GPUs are taken, never planned"
    return head + "\n" + render_table(["JOBID", "USER", "NAME", "STATE", "GPUS", "NODES"], table)


def render_jobs(jobs: Sequence[JobRow], fmt: str | None = None, header: bool = True) -> str:
    """The jobs as a table: ``fmt`` as squeue's -o (``%.8i %j %T``) or a list of field
    names (``jobid,name,phase``); default: hpcorch's columns."""
    if fmt is None:
        fmt = MANAGED_FIELDS if any(j.phase for j in jobs) else DEFAULT_FIELDS
        if any(j.gpu_type or j.gpu_types for j in jobs):  # GPU types in play: a column
            fmt = fmt.replace(",gpus,", ",gpus,gputype,")
    return render_rows(parse_format(fmt, JOB_FIELDS), jobs, header)


def render_status(
    pool: Sequence[PoolRow],
    jobs: Sequence[JobRow],
    fmt: str | None = None,
    header: bool = True,
    show_pool: bool = True,
) -> str:
    """The pool, then the jobs (or "no hpcorch jobs")."""
    out = [render_pool(pool), ""] if show_pool else []
    if not jobs and header:
        out.append("no hpcorch jobs")
    elif jobs or not header:
        out.append(render_jobs(jobs, fmt, header))
    return "\n".join(out).rstrip("\n")


def status_document(pool: Sequence[PoolRow], jobs: Sequence[JobRow]) -> dict[str, Any]:
    """``status --json``: versioned, so that scripts can check what they read."""
    return {
        "version": STATUS_VERSION,
        "pool": [asdict(p) for p in pool],
        "jobs": [asdict(j) for j in jobs],
    }
