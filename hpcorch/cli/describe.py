"""``hpcorch describe``: one job's plans, resizes and throughput by GPU count.

The job comes from the controller's state database when this user may read it, else from
the controller's query socket (:mod:`hpcorch.cli.poolview`): the user's own job in full,
another user's as squeue shows it. Both are rendered here, by the same code.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, fields
from typing import Any

import click

from hpcorch.cli import params
from hpcorch.cli.poolview import access, ask_job
from hpcorch.controller.query import record_from, throughput_by_gpus
from hpcorch.controller.store import Decision, JobRecord, Store
from hpcorch.errors import HpcorchError
from hpcorch.paths import STATE_DB, controller_dir
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.script import parse_comment
from hpcorch.status import fmt_duration, render_table

_DECISION_FIELDS = {f.name for f in fields(Decision)}


class Detail:
    """What describe shows of one job."""

    def __init__(
        self,
        rec: JobRecord,
        full: bool,
        decisions: list[Decision],
        left_out: int,
        throughput: list[tuple[int, float, int]],
    ) -> None:
        self.rec = rec
        self.full = full
        self.decisions = decisions
        self.left_out = left_out
        """Earlier decisions the controller did not send."""
        self.throughput = throughput


def detail_from_db(state_dir: str | None, job_id: int) -> Detail | None:
    store = Store(controller_dir(state_dir) / STATE_DB, readonly=True)
    try:
        rec = store.job(job_id)
        if rec is None:
            return None
        return Detail(
            rec, True, store.decisions(job_id), 0, throughput_by_gpus(store.samples(job_id))
        )
    finally:
        store.close()


def detail_from_reply(reply: dict[str, Any]) -> Detail | None:
    doc = reply.get("job")
    if not isinstance(doc, dict):
        return None
    decisions = [
        Decision(**{k: v for k, v in d.items() if k in _DECISION_FIELDS})
        for d in reply.get("decisions", [])
    ]
    throughput = [(int(g), float(m), int(n)) for g, m, n in reply.get("throughput", [])]
    left_out = int(reply.get("decisions_left_out", 0))
    return Detail(record_from(doc), bool(doc.get("full")), decisions, left_out, throughput)


@click.command()
@click.argument("job_id", type=params.JOB_ID)
@click.option(
    "--state-dir",
    envvar="HPCORCH_CONTROLLER_DIR",
    type=params.StateDir(),
    help="Controller state directory [default: $HPCORCH_HOME/controller].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (versioned).")
def describe(job_id: int, state_dir: str | None, as_json: bool) -> None:
    """One job's plans, resizes and throughput by GPU count."""
    from hpcorch.cli.status import describe_from_slurm

    how = access(controller_dir(state_dir))
    if how == "none" and as_json:
        click.echo(json.dumps(slurm_document(job_id), indent=2))
        return
    if how == "none":
        describe_from_slurm(job_id)  # no controller here: what Slurm and the job dir say
        return
    try:
        if how == "db":
            detail = detail_from_db(state_dir, job_id)
        else:
            detail = detail_from_reply(ask_job(controller_dir(state_dir), "describe", job_id))
    except HpcorchError as exc:
        raise click.ClickException(str(exc)) from None
    if detail is None and as_json:
        click.echo(json.dumps(slurm_document(job_id), indent=2))
        return
    if detail is None:
        describe_from_slurm(job_id)
        return
    if as_json:
        click.echo(json.dumps(document(detail, slurm_view(job_id)), indent=2))
        return
    click.echo("\n".join(render(detail, slurm_view(job_id))))


JSON_VERSION = 1
_SHARED: tuple[str, ...] = ("slurm_id", "name", "user", "phase", "gpus", "min_gpus")
_SHARED += ("max_gpus", "launches", "resizes", "gpu_seconds", "gpu_type", "gpu_types")
"""The fields of another user's job describe shows (as the text does)."""


def document(d: Detail, slurm: str) -> dict[str, Any]:
    """describe --json: the job's record (another user's: what the text shows of it), its
    decisions and throughput by GPU count, and Slurm's view as one line."""
    rec = asdict(d.rec)
    return {
        "version": JSON_VERSION,
        "full": d.full,
        "job": rec if d.full else {k: rec[k] for k in _SHARED},
        "slurm": slurm,
        "decisions": [asdict(x) for x in d.decisions] if d.full else [],
        "decisions_left_out": d.left_out,
        "throughput": [{"gpus": g, "samples_per_s": m, "reports": n} for g, m, n in d.throughput],
    }


def slurm_document(job_id: int) -> dict[str, Any]:
    """describe --json of a job no controller here knows: Slurm's view alone."""
    slurm = slurm_view(job_id)
    if not slurm:
        raise click.ClickException(f"job {job_id} is known neither to Slurm nor to a controller")
    return {"version": JSON_VERSION, "full": False, "job": None, "slurm": slurm}


def type_lines(rec: JobRecord) -> list[str]:
    """The job's GPU types, where any are in play: what it runs on, what it accepts."""
    if not (rec.gpu_type or rec.gpu_types or rec.target_type):
        return []
    accepts = ", ".join(rec.accepted_types()) or "any"
    line = f"  GPU type {rec.gpu_type or '-'} (accepts {accepts}"
    if rec.target_type and rec.phase in ("starting", "stopping"):
        line += f"; next launch on {rec.target_type}"
    return [line + ")"]


def render(d: Detail, slurm: str) -> list[str]:
    rec = d.rec
    if not d.full:
        return [
            f"job {rec.slurm_id} ({rec.name}) of {rec.user}: {rec.phase}",
            *([f"  Slurm: {slurm}"] if slurm else []),
            f"  GPUs {rec.gpus} (range {rec.min_gpus}-{rec.max_gpus}), launches "
            f"{rec.launches}, resizes {rec.resizes}, GPU time {fmt_duration(int(rec.gpu_seconds))}",
            *type_lines(rec),
            f"  its directory, plans, decisions and throughput are visible to {rec.user} and "
            "the admins only",
        ]
    out = [f"job {rec.slurm_id} ({rec.name}) of {rec.user}: {rec.phase} - {rec.reason}"]
    if slurm:
        out.append(f"  Slurm: {slurm}")
    out.append(
        f"  GPUs {rec.gpus} (range {rec.min_gpus}-{rec.max_gpus}), global batch "
        f"{rec.global_batch or rec.batch} = {rec.micro_batch or '?'} x {rec.accum_steps} x "
        f"{rec.gpus or '?'}, launches {rec.launches}, resizes {rec.resizes}, "
        f"failures {rec.failures}, GPU time {fmt_duration(int(rec.gpu_seconds))}"
    )
    out += type_lines(rec)
    out.append(f"  directory {rec.job_dir or '?'}")
    budget = fmt_duration(rec.time_budget_s) if rec.time_budget_s else "none"
    cap = rec.max_relaunches if rec.max_relaunches >= 0 else "no cap"
    out.append(
        f"  run time {fmt_duration(rec.run_total_s)} of budget {budget}; relaunches after "
        f"checkpoints of its own {rec.time_relaunches} (cap {cap})"
    )
    mode = rec.mode + (" (detected at launch)" if rec.mode_detected else "")
    if rec.mode == "sidecar":
        movable = "resizable" if rec.movable else rec.fixed_reason()
        progress = "reports progress" if rec.predictable else "no progress source (LAS)"
        out.append(
            f"  mode {mode}: {movable}; {progress}; checkpoints seen {rec.checkpoints}; "
            f"steps lost to stops {rec.lost_steps}; killed after the grace {rec.kills}"
        )
    else:
        out.append(f"  mode {mode}")
    rows = []
    for dec in d.decisions:
        took = f"{dec.done_at - dec.time:.2f}s" if dec.done_at else "-"
        rows.append(
            [
                _clock(dec.time),
                dec.action,
                f"{dec.from_gpus}->{dec.to_gpus}",
                str(dec.global_batch),
                dec.status,
                took,
                dec.detail,
            ]
        )
    out.append("\ndecisions")
    if d.left_out:
        out.append(f"  ({d.left_out} earlier decisions not shown)")
    out.append(
        render_table(["TIME", "ACTION", "GPUS", "BATCH", "STATUS", "TOOK", "DETAIL"], rows)
        if rows
        else "  none"
    )
    out.append("\nthroughput by GPU count")
    out.append(
        render_table(
            ["GPUS", "SAMPLES/S", "REPORTS"],
            [[str(g), f"{m:.1f}", str(n)] for g, m, n in d.throughput],
        )
        if d.throughput
        else "  no reports yet"
    )
    return out


def slurm_view(job_id: int) -> str:
    """What Slurm says of the job (squeue, else sacct); "" if it cannot be asked."""
    from hpcorch.slurm.history import with_history

    try:
        backend = make_backend()
        jobs = with_history([j for j in backend.jobs() if j.job_id == job_id], [job_id], backend)
    except HpcorchError:
        return ""
    if not jobs:
        return ""
    j = jobs[0]
    parts = [j.state, f"user {j.user}", f"partition {j.partition or '-'}"]
    for label, value in (("account", getattr(j, "account", "")), ("qos", getattr(j, "qos", ""))):
        if value:
            parts.append(f"{label} {value}")
    if j.nodes:
        parts.append(f"nodes {j.nodes}")
    if j.reservation:
        parts.append(f"reservation {j.reservation}")
    pin = (parse_comment(j.comment) or {}).get("pin")
    if pin:
        parts.append(f"pinned to {pin} GPUs (hpcorch resize)")
    if j.state not in ("PENDING", "RUNNING"):
        parts.append(f"exit code {j.exit_code}")
    return ", ".join(parts)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
