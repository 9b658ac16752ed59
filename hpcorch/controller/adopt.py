"""A job's record when the controller first sees it, or sees it again. Pure.

The record comes from the job's checked comment (hpcorch/controller/validate.py) and what
Slurm reports. A comment that fails the checks gives a ``refused`` record with the reason:
the controller never acts on that job, and says why in ``hpcorch status``.
"""

from __future__ import annotations

from dataclasses import replace

from hpcorch.cluster import ObservedJob
from hpcorch.controller.store import JobRecord
from hpcorch.controller.validate import TagError, parse_tags, printable
from hpcorch.protocol import DEFAULT_MAX_RELAUNCHES


def phase_of(j: ObservedJob) -> str:
    """The phase a job is in, as far as Slurm's report tells."""
    if j.state == "PENDING":
        return "queued" if j.held else "starting"
    if j.ended:
        return {
            "COMPLETED": "done" if j.exit_code == 0 else "failed",
            "CANCELLED": "cancelled",
        }.get(j.state, "failed")
    return "running"


def refused(j: ObservedJob, now: float, why: str) -> JobRecord:
    """The record of a job the controller will not manage, with the reason."""
    rec = _inert(j.slurm_id, j.name, j.user, j.submit_time or now, "refused", now)
    rec.reason, rec.uid = f"refused: {printable(why, 200)}", j.uid
    return rec


def _inert(sid: int, name: str, user: str, submitted: float, phase: str, now: float) -> JobRecord:
    """A record in a final ``phase`` with the smallest valid values: nothing to act on."""
    return JobRecord(
        slurm_id=sid,
        job_key=str(sid),
        name=printable(name),
        user=printable(user, 32),
        job_dir="",
        app="",
        min_gpus=1,
        max_gpus=1,
        batch=1,
        max_batch=1,
        max_micro=1,
        submit_time=submitted,
        phase=phase,
        phase_since=now,
        finished_at=now,
    )


INTERACTIVE = (
    "an interactive allocation (salloc, srun) can neither be asked to checkpoint through a "
    "batch script nor be requeued: the pool runs batch jobs only (hpcorch submit)"
)


def new_record(j: ObservedJob, now: float) -> JobRecord:
    """The record of a job the controller has not seen before."""
    if not j.batch:
        return refused(j, now, INTERACTIVE)
    try:
        t = parse_tags(j.tags)
    except TagError as exc:
        return refused(j, now, str(exc))
    min_gpus = t.min_gpus or max(1, j.gpus)
    max_gpus = max(min_gpus, t.max_gpus or min_gpus)
    batch = t.batch or 32 * min_gpus
    phase = phase_of(j)
    rec = JobRecord(
        slurm_id=j.slurm_id,
        job_key=t.key or str(j.slurm_id),
        name=printable(j.name),
        user=printable(j.user, 32),
        job_dir=t.job_dir,
        app=t.app or "",
        min_gpus=min_gpus,
        max_gpus=max_gpus,
        batch=batch,
        max_batch=max(batch, t.max_batch or batch),
        max_micro=t.micro or max(1, batch // min_gpus),
        submit_time=j.submit_time or now,
        phase=phase,
        phase_since=now,
        target_gpus=j.gpus if phase in ("running", "starting") else 0,
        slurm_restarts=j.restarts,
        reason="adopted" if phase != "queued" else "waiting for GPUs",
        mode="sidecar" if t.sidecar else "managed",
        resumable=int(t.resumable),
        predictable=int(t.predictable),
        stop_grace_s=float(t.grace_s),
        min_cpus=t.min_cpus or 1,
        time_budget_s=float(t.budget_s),
        max_relaunches=DEFAULT_MAX_RELAUNCHES if t.max_relaunches is None else t.max_relaunches,
        uid=j.uid,
        gpu_types=",".join(t.gpu_types),
        time_limit_min=j.time_limit_min if j.time_limit_min > 0 else -1,
    )
    # the length its user declared, until the job reports its own
    if t.epochs:
        rec.epochs = t.epochs
    if t.dataset:
        rec.steps_per_epoch = t.dataset / max(1, rec.batch)
    if phase == "starting" and not rec.target_gpus:
        rec.target_gpus = rec.min_gpus
    return rec


def readopt(old: JobRecord, j: ObservedJob, now: float) -> JobRecord:
    """A job marked lost that Slurm lists again: its phase and shape from what Slurm
    reports now, its history (launches, GPU time, samples) kept."""
    fresh = new_record(j, now)
    if fresh.phase == "refused":
        return fresh
    rec = replace(
        old,
        phase=fresh.phase,
        phase_since=now,
        finished_at=0.0,
        target_gpus=fresh.target_gpus,
        gpus=j.gpus if fresh.phase == "running" else 0,
        nodes=len(j.node_names) if fresh.phase == "running" else 0,
        node_list=",".join(j.node_names) if fresh.phase == "running" else "",
        uid=j.uid,
        retry_at=0.0,
        reason=f"reappeared in Slurm ({j.state.lower()}): re-adopted",
    )
    if fresh.phase in ("done", "failed", "cancelled"):
        rec.finished_at = now
    return rec


def quarantined(rec: JobRecord, now: float) -> JobRecord:
    """A record that can always be stored, for a job whose own record could not be: failed,
    with the reason; the controller no longer acts on the job."""
    out = _inert(rec.slurm_id, str(rec.name), str(rec.user), now, "failed", now)
    out.reason = printable(str(rec.reason), 400)
    return out
