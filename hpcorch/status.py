"""The view behind ``hpcorch status``: Slurm's jobs and nodes in, rows and text out. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hpcorch.slurm.parse import SlurmJob, SlurmNode
from hpcorch.slurm.script import parse_comment


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
    """The controller's phase of the job, when a controller manages it."""
    micro_batch: int = 0
    accum_steps: int = 0
    samples_per_s: float = 0.0
    mode: str = "managed"
    """managed (the script uses the runtime) or sidecar; "(detected)" when found at launch."""
    lost_steps: int = 0

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


@dataclass(frozen=True)
class PoolRow:
    node: str
    state: str
    gpus: int
    gpus_busy: int


def _int(fields: dict[str, str], key: str) -> int | None:
    """A tag of the comment as a number, None unless 1-9 ASCII digits (a user writes it)."""
    value = fields.get(key, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None


def job_rows(
    jobs: Sequence[SlurmJob],
    now: int,
    user: str | None = None,
    managed: Mapping[int, Managed] | None = None,
) -> list[JobRow]:
    """hpcorch's jobs (marked by their comment), optionally one user's, oldest first."""
    managed = managed or {}
    rows = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        fields = parse_comment(job.comment)
        if fields is None or (user is not None and job.user != user):
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
            )
        )
    return rows


def pool_rows(nodes: Sequence[SlurmNode], partition: str | None = None) -> list[PoolRow]:
    return [
        PoolRow(n.name, "+".join(s.lower() for s in n.states), n.gpus, n.gpus_used)
        for n in sorted(nodes, key=lambda n: (len(n.name), n.name))
        if n.gpus and (partition is None or partition in n.partitions)
    ]


def fmt_duration(seconds: int) -> str:
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    hms = f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render_status(pool: Sequence[PoolRow], jobs: Sequence[JobRow]) -> str:
    total = sum(p.gpus for p in pool)
    busy = sum(p.gpus_busy for p in pool)
    out = [f"POOL  {len(pool)} nodes, {total} GPUs: {busy} busy, {total - busy} free"]
    if pool:
        out.append(
            render_table(
                ["NODE", "STATE", "GPUS", "BUSY"],
                [[p.node, p.state, str(p.gpus), str(p.gpus_busy)] for p in pool],
            )
        )
    out.append("")
    if not jobs:
        out.append("no hpcorch jobs")
        return "\n".join(out)
    managed = any(j.phase for j in jobs)
    headers = ["JOBID", "NAME", "USER", "MODE", "STATE", "GPUS", "MIN-MAX", "BATCH", "RESTARTS"]
    headers.append("TIME")
    headers += ["SAMPLES/S", "NODELIST", "REASON"] if managed else ["NODELIST(REASON)"]
    rows = []
    for j in jobs:
        row = [
            str(j.job_id),
            j.name,
            j.user,
            j.mode,
            j.phase.upper()
            if (managed and j.phase and j.state != "PENDING") or j.phase in ("queued", "refused")
            else j.state,
            str(j.gpus) if j.state != "PENDING" else "0",
            f"{j.min_gpus}-{j.max_gpus}",
            j.batch_text(),
            str(j.restarts),
            fmt_duration(j.run_time_s),
        ]
        if managed:
            row += [
                f"{j.samples_per_s:.0f}" if j.samples_per_s else "-",
                j.nodes if j.state != "PENDING" else "-",
                j.reason,
            ]
        else:
            row.append(f"({j.reason})" if j.state == "PENDING" else j.nodes)
        rows.append(row)
    out.append(render_table(headers, rows))
    return "\n".join(out)


def status_document(pool: Sequence[PoolRow], jobs: Sequence[JobRow]) -> dict[str, Any]:
    return {"pool": [asdict(p) for p in pool], "jobs": [asdict(j) for j in jobs]}
