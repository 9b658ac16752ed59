"""The job state machine. Pure: a job's record and what the cluster reports in, the
record's next state and the actions to take out. No IO, so every transition is testable.

Phases (the diagram is in docs/controller.md):

    queued ──start──> starting ──(Slurm runs it)──> running ──signal──> stopping
      ^                  ^                              |                  |
      |                  └──────── (exit 75: requeue held, reshape, release) ┘
      └──────────── (exit 75 with target 0: requeue held = preempted) ────────┘
    running/starting ──exit 0──> done;  ──failure──> starting (retry) or failed
    any ──scancel──> cancelled;  any ──gone from Slurm──> lost
    running ──time budget spent: signal──> stopping ──(exit)──> timeout
    running ──checkpointed on its own past --max-relaunches──> timeout

Every action is safe to repeat, and every phase can be re-entered from what Slurm
reports, so a controller killed between two actions continues where it stopped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcorch.cluster import ObservedJob, PoolNode, Shape, fill_gpus
from hpcorch.controller.store import JobRecord
from hpcorch.protocol import EXIT_CONFIG, EXIT_RELAUNCH, EXIT_STORAGE, EXIT_UNPLANNED
from hpcorch.timefmt import fmt_duration


@dataclass(frozen=True)
class Settings:
    grace_s: float = 120.0
    """How long a signalled job may take to checkpoint before it is requeued by force."""
    force_retry_s: float = 60.0
    """A forced requeue that Slurm does not show yet (the job still runs) is asked again
    only after this long: the requeue is forced once, not at every cycle."""
    resignal_s: float = 15.0
    """A signalled job still running after this long is signalled again."""
    max_retries: int = 2
    """Relaunches after a failure before the job is left failed."""
    min_run_s: float = 60.0
    """A launch trains at least this long (and at least the restart cost the policy is
    told) after it reported its start before the controller resizes or preempts it."""
    startup_s: float = 600.0
    """A launch that has not reported its start is left alone this long (it could not
    checkpoint yet: a signal would kill it); after that it is treated as started."""
    relaunch_delay_s: float = 1.0
    """A relaunch (after a run ended) is released this many seconds after the start of
    the whole second in which the controller saw the run end; the requeue happens at
    once. slurmd refuses a job id's new launch whose credential was made in the second
    it revoked the last run's credential, or earlier ("Job credential revoked"); it
    revokes it before Slurm shows the run as ended, so the next whole second is safe
    (local pool: a release 0.55 s after the end's second was refused, 1.03 s after ran)."""
    exact_wait_s: float = 10.0
    """How long an uneven launch whose planned GPUs are free waits for its nodes' other
    free GPUs to be taken before it goes with the split Slurm picks (:func:`launch_wait`)."""
    start_backoff_s: float = 2.0
    """After a failed start (or a failed launch), the job waits this long before it is
    started again, doubled at every failure in a row."""
    start_backoff_max_s: float = 300.0
    max_start_failures: int = 5
    """Starts in a row that may fail (the plan cannot be written, Slurm refuses) before the
    job is left failed."""
    launch_pending_s: float = 90.0
    """A launch the controller released that Slurm still keeps pending after this long is
    held again and planned afresh (Slurm's reason in the job's reason and the log)."""


REQUEUED = "requeued by Slurm"
REQUEUE_WAIT_S = 30.0
"""A job Slurm requeued after a node failure is left this long for Slurm to start on its
old nodes (a node whose slurmd restarts is back within seconds); then it is restarted
anywhere in the pool, without the node list that names the failed node."""


@dataclass(frozen=True)
class Action:
    """One thing to ask of the cluster."""

    kind: str
    """start, hold, signal, requeue_hold, or rebatch (a running job's plan rewritten with
    its own launch number: a new global batch at its next step, no restart)."""
    slurm_id: int
    shape: Shape | None = None
    reason: str = ""


@dataclass
class Outcome:
    actions: list[Action] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    """Decisions worth recording (resize, preempt, retry, ...), as 'kind: detail'."""


def _set_phase(rec: JobRecord, phase: str, now: float, reason: str | None = None) -> None:
    if rec.phase != phase:
        rec.phase = phase
        rec.phase_since = now
    if reason is not None:
        rec.reason = reason


def target_shape(rec: JobRecord, pool_nodes: tuple[str, ...]) -> Shape:
    """The launch shape for the record's target: exactly the planned placement (its GPUs on
    each planned node, the nodes in rank order) when it is known and every planned node
    exists; else the fewest even nodes for Slurm to choose."""
    placement = rec.placement()
    if placement and all(0 <= i < len(pool_nodes) for i in placement):
        names = tuple(pool_nodes[i] for i in placement)
        counts = tuple(placement.values())
        return Shape(len(names), max(counts), names, rec.target_cpus, counts)
    per_node = max(placement.values()) if placement else rec.target_gpus
    for nodes in range(1, rec.target_gpus + 1):
        if rec.target_gpus % nodes == 0 and rec.target_gpus // nodes <= max(per_node, 1):
            return Shape(nodes, rec.target_gpus // nodes, (), rec.target_cpus)
    return Shape(rec.target_gpus, 1, (), rec.target_cpus)


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
    for sid, claim in (claims or {}).items():
        for node, n in claim.items():
            if sid != rec.slurm_id:
                others[node] = others.get(node, 0) + n
    return launch_wait(shape, nodes, now - rec.phase_since, s.exact_wait_s, others)


def launch_wait(
    shape: Shape,
    nodes: Sequence[PoolNode],
    waited_s: float = 0.0,
    limit_s: float = 0.0,
    claimed: Mapping[str, int] | None = None,
) -> str:
    """Why an uneven launch must wait before it is handed to the cluster ('' = go now).

    An even shape is held to its count on every node by Slurm itself. An uneven one is
    one GPU count on its nodes, which the cluster spreads by :func:`fill_gpus`; released
    while its nodes' free GPUs allow another split, it would start at once with that
    split (or before a stopping job has freed the planned GPUs). So it waits until the
    free GPUs leave exactly the planned split. When the planned GPUs are free and the
    nodes' other free GPUs are ones no other starting job is to take (``claimed``: GPUs
    per node name; the plan leaves them idle), waiting cannot help: it goes with the split
    the cluster chooses on the same nodes, as it does after ``limit_s`` (``waited_s`` so
    far) in any case."""
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
        if waited_s >= limit_s > 0 or not any(
            f > c and others.get(name, 0) > 0 for (name, c), f in zip(mine, have_free, strict=True)
        ):
            return ""
    have = " ".join(f"{name}:{free.get(name, 0)}" for name, _ in mine)
    want = " ".join(f"{name}:{c}" for name, c in mine)
    return f"waiting until the free GPUs ({have}) leave one split: {want}"


def observe(
    rec: JobRecord,
    job: ObservedJob | None,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
) -> Outcome:
    """Move ``rec`` along with what the cluster reports about it."""
    out = Outcome()
    if not rec.active:
        return out
    if job is None:
        _set_phase(rec, "lost", now, "vanished from Slurm while the controller was not looking")
        rec.finished_at = now
        out.events.append("lost: job no longer known to Slurm")
        return out
    if rec.phase == "running" and rec.gpus:
        span = max(0.0, now - max(rec.phase_since, rec.started_at))
        rec.run_seconds = max(rec.run_seconds, span)
    restarts_before = rec.slurm_restarts
    if job.state == "CANCELLED":
        _set_phase(rec, "cancelled", now, "cancelled")
        rec.finished_at = now
        out.events.append("cancelled: by its user or an admin")
    elif job.state == "COMPLETED" and job.exit_code == 0:
        _set_phase(rec, "done", now, "finished")
        rec.finished_at = now
        rec.exit_code = 0
        out.events.append("done: training finished")
    elif job.ended:
        _ended(rec, job, now, pool_nodes, s, out)
    elif job.state == "PENDING":
        _pending(rec, job, now, pool_nodes, out, s)
    else:  # RUNNING, COMPLETING, CONFIGURING, SUSPENDED, ...
        _running(rec, job, now, s, out)
    rec.slurm_restarts = max(restarts_before, job.restarts)
    return out


def _relaunch(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome, why: str
) -> None:
    rec.slurm_launch = 0
    out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
    if rec.target_gpus > 0:
        out.actions.append(Action("start", rec.slurm_id, target_shape(rec, pool_nodes), why))
        _set_phase(rec, "starting", now, why)
    else:
        _set_phase(rec, "queued", now, why)
    rec.phase_since = now  # when the end was seen: the relaunch waits from here


def _ended(
    rec: JobRecord,
    job: ObservedJob,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    out: Outcome,
) -> None:
    rec.exit_code = job.exit_code
    if rec.budget_spent():
        _timeout(
            rec,
            now,
            out,
            f"time budget spent: ran {fmt_duration(rec.run_total_s)} of "
            f"{fmt_duration(rec.time_budget_s)} over {rec.launches} launch(es)",
        )
        return
    if job.exit_code == EXIT_RELAUNCH:
        if rec.phase != "stopping":
            rec.time_relaunches += 1
            if 0 <= rec.max_relaunches < rec.time_relaunches:
                _timeout(
                    rec,
                    now,
                    out,
                    f"checkpointed on its own (time limit?) {rec.time_relaunches} times: "
                    f"--max-relaunches {rec.max_relaunches} reached",
                )
                return
        if rec.phase == "stopping":
            if rec.target_gpus == 0:
                why = "preempted: checkpointed and queued"
            else:
                why = f"resized {rec.gpus} -> {rec.target_gpus} GPUs"
                rec.resizes += 1
        else:
            rec.target_gpus = rec.target_gpus or rec.gpus or rec.min_gpus
            why = "checkpointed on its own (time limit?): relaunched"
        out.events.append(f"checkpointed: {why}")
        _relaunch(rec, now, pool_nodes, out, why)
        return
    if job.exit_code == EXIT_STORAGE:
        _storage_failed(rec, now, s, out)
        return
    if job.exit_code == EXIT_UNPLANNED:
        _unplanned(rec, now, s, out)
        return
    if rec.slurm_launch and not rec.ready:
        _node_refused(rec, job, now, s, out)
        return
    rec.failures += 1
    what = f"{job.state.lower()} with exit code {job.exit_code}"
    if job.exit_code == EXIT_CONFIG:
        _set_phase(rec, "failed", now, f"{what}: a bad plan or checkpoint, not retried")
        rec.finished_at = now
        out.events.append(f"failed: {rec.reason}")
        return
    if rec.failures <= s.max_retries:
        # back in the queue, its GPUs free for others, started again after a back-off: a
        # launch that fails at once (a full disk, a bad node) does not loop
        delay = min(s.start_backoff_max_s, s.start_backoff_s * 2 ** (rec.failures - 1))
        why = f"{what}: retry {rec.failures}/{s.max_retries} from the last checkpoint"
        out.events.append(f"retry: {why} in {delay:.0f} s")
        out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
        rec.target_gpus = 0
        rec.retry_at = now + delay
        _set_phase(rec, "queued", now, f"{why} in {delay:.0f} s")
    else:
        _set_phase(rec, "failed", now, f"{what}; gave up after {s.max_retries} retries")
        rec.finished_at = now
        out.events.append(f"failed: {rec.reason}")


UNPLANNED = "started without the controller's plan (released by its user or an admin): held again"


def _unplanned(rec: JobRecord, now: float, s: Settings, out: Outcome) -> None:
    """The wrapper found no plan of the controller's and ran nothing (EXIT_UNPLANNED).
    Released by its owner or an admin while queued: held again, not a try. Released while
    the controller was starting it (the plan not written yet, or unreadable on the node):
    planned again after a back-off, counted as a failed start (bounded; a launch that
    trains resets the count)."""
    out.actions.append(Action("requeue_hold", rec.slurm_id, reason=UNPLANNED))
    rec.target_gpus = 0
    rec.target_placement = "{}"
    if rec.phase == "queued":
        out.events.append(f"unplanned: {UNPLANNED} (not a try)")
        rec.reason = UNPLANNED
        return
    rec.start_failures += 1
    n = rec.start_failures
    what = "its launch found no plan from the controller (exit 77)"
    if n >= s.max_start_failures:
        _set_phase(rec, "failed", now, f"{what}; gave up after {n} tries")
        rec.finished_at = now
        rec.retry_at = 0.0
        out.events.append(f"failed: {rec.reason}")
        return
    delay = min(s.start_backoff_max_s, s.start_backoff_s * 2 ** (n - 1))
    why = f"{what}: planned again, retry {n}/{s.max_start_failures - 1} in {delay:.0f} s"
    out.events.append(f"retry: {why}")
    rec.retry_at = now + delay
    _set_phase(rec, "queued", now, why)
    rec.phase_since = now


def _node_refused(rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome) -> None:
    """A launch Slurm made on its own after a node failure ended before it trained: the
    returning node refused it ("Job credential revoked"), not the job's doing. Never a try of
    the job: back in the queue after a short back-off, planned afresh."""
    rec.slurm_launch = 0
    delay = s.start_backoff_s
    why = (
        f"Slurm's restart after a node failure ended at once ({job.state.lower()}, exit code "
        f"{job.exit_code}) before training: not counted as a try, planned again in "
        f"{delay:.0f} s"
    )
    out.events.append(f"requeued: {why}")
    out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
    rec.target_gpus = 0
    rec.target_placement = "{}"
    rec.retry_at = now + delay
    _set_phase(rec, "queued", now, why)
    rec.phase_since = now


def _timeout(rec: JobRecord, now: float, out: Outcome, why: str) -> None:
    """The job ends for good, its last checkpoint kept: a resubmission continues from it."""
    _set_phase(rec, "timeout", now, f"{why}; not relaunched (resubmit to continue)")
    rec.finished_at = now
    out.events.append(f"timeout: {rec.reason}")


def _storage_failed(rec: JobRecord, now: float, s: Settings, out: Outcome) -> None:
    """The runtime could not write the job directory (EXIT_STORAGE): a lasting condition,
    backed off like a failed start (GPUs released, retried after 2, 4, 8.. s), the job
    failed at the ``max_start_failures``-th in a row (a run that reports its start resets
    the count)."""
    rec.start_failures += 1
    n = rec.start_failures
    what = (
        f"its job directory cannot be written (exit {EXIT_STORAGE}: no space, read-only or "
        "permission denied)"
    )
    if n >= s.max_start_failures:
        _set_phase(rec, "failed", now, f"{what}; gave up after {n} tries")
        rec.finished_at = now
        rec.retry_at = 0.0
        out.events.append(f"failed: {rec.reason}")
        return
    delay = min(s.start_backoff_max_s, s.start_backoff_s * 2 ** (n - 1))
    why = f"{what}: GPUs released, retry {n}/{s.max_start_failures - 1} in {delay:.0f} s"
    out.events.append(f"retry: {why}")
    out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
    rec.target_gpus = 0
    rec.retry_at = now + delay
    _set_phase(rec, "queued", now, why)
    rec.phase_since = now


def _pending(
    rec: JobRecord,
    job: ObservedJob,
    now: float,
    pool_nodes: tuple[str, ...],
    out: Outcome,
    s: Settings,
) -> None:
    if job.held:
        if rec.phase == "starting":  # the start was cut short (controller restart): redo it
            out.actions.append(
                Action("start", rec.slurm_id, target_shape(rec, pool_nodes), "resume start")
            )
        elif rec.phase == "stopping":  # requeued, but the relaunch was cut short
            _relaunch_from_held(rec, now, pool_nodes, out)
        elif rec.phase == "running":
            _set_phase(rec, "queued", now, "held by its user or an admin")
        return
    if (
        rec.phase == "starting"
        and rec.reason.startswith(REQUEUED)
        and now - rec.phase_since >= REQUEUE_WAIT_S
    ):  # requeued by Slurm and still pending on its old nodes: restart it anywhere
        shape = target_shape(rec, pool_nodes)
        rec.reason = "restarting anywhere after a node failure"
        out.actions.append(
            Action("start", rec.slurm_id, Shape(shape.nodes, shape.gpus_per_node), rec.reason)
        )
        return
    # requeued by Slurm (a node failure), also while it was being stopped for a resize
    if rec.phase == "running" or (rec.phase == "stopping" and job.restarts > rec.slurm_restarts):
        _set_phase(rec, "starting", now, f"{REQUEUED} (restart {job.restarts})")
        out.events.append(f"requeued: by Slurm, restart {job.restarts} (node failure?)")
        # Its node list may name the failed node. Slurm starts it there once the node is
        # back (a restarted slurmd); if it still waits after REQUEUE_WAIT_S, the controller
        # restarts it anywhere in the pool (_pending).
        rec.target_gpus = rec.target_gpus or rec.gpus or rec.min_gpus
        rec.target_placement = "{}"
        rec.slurm_launch = 1
    elif rec.phase in ("queued", "stopping"):
        # released by its owner or an admin, not by the controller: held again, and started
        # by the controller alone (with its plan) when its turn comes
        why = "released outside the controller: held again (the controller starts it)"
        out.actions.append(Action("hold", rec.slurm_id, reason=why))
        out.events.append(f"hold: {why}")
        rec.reason = why
    elif rec.phase == "starting" and not rec.reason.startswith(REQUEUED):
        _launch_pending(rec, job, now, s, out)


def _launch_pending(
    rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome
) -> None:
    """A launch the controller released that Slurm keeps pending: Slurm's reason shown, and
    past ``launch_pending_s`` held again and planned afresh (its GPUs free for others)."""
    waited = now - rec.phase_since
    slurm_reason = job.reason or "no reason given"
    if waited < s.launch_pending_s:
        rec.reason = f"starting: Slurm keeps it pending ({slurm_reason}) for {waited:.0f} s"
        return
    why = f"Slurm kept the launch pending {waited:.0f} s ({slurm_reason}): held and planned again"
    out.actions.append(Action("hold", rec.slurm_id, reason=why))
    out.events.append(f"replan: {why}")
    rec.target_gpus = 0
    rec.target_placement = "{}"
    rec.retry_at = now + s.start_backoff_s
    _set_phase(rec, "queued", now, why)


def _relaunch_from_held(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome
) -> None:
    if rec.budget_spent():
        _timeout(rec, now, out, "time budget spent (the checkpoint was forced)")
    elif rec.target_gpus > 0:
        out.actions.append(
            Action("start", rec.slurm_id, target_shape(rec, pool_nodes), "resume relaunch")
        )
        _set_phase(rec, "starting", now)
    else:
        _set_phase(rec, "queued", now, "preempted: checkpointed and queued")


def _running(rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome) -> None:
    if rec.phase == "queued":
        # Slurm runs a job the controller did not start (released by its owner or an admin
        # before the controller could hold it again): it never trains without a plan (the
        # wrapper refuses it), and is put back, held, without counting a launch or a try
        if job.state in ("RUNNING", "CONFIGURING"):
            out.actions.append(Action("requeue_hold", rec.slurm_id, reason=UNPLANNED))
            out.events.append(f"unplanned: {UNPLANNED}")
            rec.reason = UNPLANNED
        return
    if rec.phase == "running" and job.restarts > rec.slurm_restarts:
        # requeued and started again by Slurm between two cycles (a node failure)
        rec.launches += 1
        rec.ready, rec.ready_at = 0, 0.0
        _set_phase(rec, "running", now, f"relaunched by Slurm (restart {job.restarts})")
        rec.phase_since = now
        rec.slurm_launch = 1
        out.events.append(f"requeued: by Slurm and running again, restart {job.restarts}")
    if rec.phase in ("queued", "starting"):
        rec.launches += 1
        rec.started_at = rec.started_at or now
        rec.run_seconds = 0.0
        rec.ready, rec.ready_at = 0, 0.0
        _set_phase(rec, "running", now, f"launch {rec.launches}")
    if job.node_names:
        rec.gpus = job.gpus
        rec.nodes = len(job.node_names)
        rec.node_list = ",".join(job.node_names)
        rec.node_gpus = ",".join(str(n) for n in job.per_node)
    if rec.phase == "running" and rec.budget_spent():
        # the budget counts across launches: ask for a checkpoint, never relaunch after it
        rec.target_gpus = 0
        why = (
            f"time budget spent ({fmt_duration(rec.run_total_s)} of "
            f"{fmt_duration(rec.time_budget_s)}): checkpointing"
        )
        out.actions.append(Action("signal", rec.slurm_id, reason=why))
        out.events.append(f"budget: {why}")
        rec.signalled_at = now
        _set_phase(rec, "stopping", now, why)
        return
    if rec.phase == "stopping":
        waited = now - rec.phase_since
        grace = max(s.grace_s, rec.stop_grace_s + 30.0)  # the sidecar kills after its own
        if waited > grace:
            if rec.forced_at < rec.phase_since or now - rec.forced_at >= s.force_retry_s:
                again = rec.forced_at >= rec.phase_since
                why = f"no checkpoint within {grace:.0f} s: requeued by force"
                if again:
                    why += f" (again: Slurm still showed it {job.state.lower()})"
                out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
                out.events.append(f"forced: {why}")
                rec.forced_at = now
                rec.reason = why
        elif now - rec.signalled_at > s.resignal_s:
            out.actions.append(Action("signal", rec.slurm_id, reason="signal again"))
            rec.signalled_at = now


def trained_since(rec: JobRecord, now: float, s: Settings) -> float | None:
    """When the running launch started training: its start report, or the end of
    ``startup_s`` for one that never reports; None while it is still starting up. The
    report's time is the job's to write: one later than ``startup_s`` after the launch
    counts as that (a job cannot make itself unstoppable with a time in the future)."""
    if rec.ready:
        if rec.ready_at <= 0:
            return rec.phase_since
        return min(rec.ready_at, rec.phase_since + s.startup_s)
    if now - rec.phase_since >= s.startup_s:
        return rec.phase_since + s.startup_s
    return None


def can_stop(rec: JobRecord, now: float, s: Settings, restart_cost_s: float = 0.0) -> bool:
    """Whether a running launch may be stopped (resized, preempted) now: once it trained at
    least ``max(min_run_s, restart_cost_s)``. Every launch gains more than its restart cost
    before the next, so no policy can keep a job restarting without progress."""
    if rec.phase != "running":
        return False
    since = trained_since(rec, now, s)
    return since is not None and now - since >= max(s.min_run_s, restart_cost_s)


def decide(
    rec: JobRecord,
    target_gpus: int,
    placement: dict[int, int],
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    cpus: int = 0,
    plan_batch: int = 0,
    live_batch: bool = False,
    *,
    restart_cost_s: float = 0.0,
) -> Outcome:
    """Turn a policy target into actions for a job in a stable phase (queued or running).
    ``cpus``: CPUs per GPU of the target (0: as it is). ``plan_batch``: the global batch of
    the plan the running launch has (0: unknown: the batch it reports). A running job that
    can take a new batch while it runs (``live_batch``) and is planned at its GPUs with
    another global batch (``rec.target_batch``) gets a "rebatch": its plan rewritten.
    A running job is stopped only once it trained ``max(min_run_s, restart_cost_s)`` since
    its launch started training (``can_stop``)."""
    out = Outcome()
    if rec.budget_spent():
        return out  # it ends at its next checkpoint (observe), never starts again
    cpus_change = bool(cpus and rec.cpus_per_gpu and cpus != rec.cpus_per_gpu)
    if rec.phase == "queued" and target_gpus > 0:
        rec.slurm_launch = 0
        rec.target_gpus = target_gpus
        rec.target_cpus = cpus
        rec.target_placement = json.dumps(placement)
        shape = target_shape(rec, pool_nodes)
        out.actions.append(Action("start", rec.slurm_id, shape, f"start at {target_gpus} GPUs"))
        out.events.append(f"start: {target_gpus} GPUs")
        _set_phase(rec, "starting", now, f"starting at {target_gpus} GPUs")
    elif (
        rec.phase == "running"
        and live_batch
        and rec.ready
        and target_gpus == rec.gpus > 0
        and not cpus_change
        and rec.target_batch > 0
        and rec.target_batch != (plan_batch or rec.global_batch or rec.batch)
    ):
        was = plan_batch or rec.global_batch or rec.batch
        out.actions.append(
            Action("rebatch", rec.slurm_id, reason=f"batch {was} -> {rec.target_batch}")
        )
        out.events.append(f"rebatch: global batch {was} -> {rec.target_batch}")
    elif rec.phase == "running" and (target_gpus != rec.gpus or (cpus_change and target_gpus)):
        if not can_stop(rec, now, s, restart_cost_s):
            return out  # still starting up, or not yet trained for a restart's worth
        rec.target_gpus = target_gpus
        rec.target_cpus = cpus or rec.target_cpus
        rec.target_placement = json.dumps(placement)
        kind = "preempt" if target_gpus == 0 else "resize"
        what = f"{rec.gpus} -> {target_gpus} GPUs"
        reason = f"{kind} to {target_gpus} GPUs"
        if target_gpus == rec.gpus:
            what = f"{rec.cpus_per_gpu} -> {cpus} CPUs per GPU"
            reason = f"resize to {cpus} CPUs per GPU"
        out.actions.append(Action("signal", rec.slurm_id, reason=reason))
        rec.signalled_at = now
        out.events.append(f"{kind}: {what}")
        _set_phase(rec, "stopping", now, f"{kind}: {what}")
    return out
