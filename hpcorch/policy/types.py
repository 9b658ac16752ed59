"""What a policy sees (:class:`Snapshot`) and what it decides (:class:`Plan`).

A snapshot holds only what real jobs report to the controller: step times observed at
configurations they ran, per-epoch progress and gradient statistics, the submitted request
and bounds, attained service, the application name, plus the pool and the history of
completed jobs. It never holds a job's true remaining work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from hpcorch.gputypes import joined
from hpcorch.policy.limit_types import Limits


@dataclass(frozen=True)
class StepSample:
    """One measured configuration: seconds per step and the all-reduce part of it.

    With gradient accumulation (``accum_steps`` > 1) ``step_time`` covers all the
    micro-steps of an optimizer step, the last of which carries the all-reduce."""

    nodes: int
    gpus: int
    micro_batch: int
    step_time: float
    sync_time: float
    accum_steps: int = 1
    gpu_type: str = ""
    """The GPU type it was measured on ("" in a pool of one type)."""


@dataclass(frozen=True)
class CpuSample:
    """Step time measured at one CPUs-per-GPU count (data-loading workers per GPU).

    ``step_time`` is the wall time of one micro-step as the training loop saw it, input
    waits included; ``data_wait`` the part of it spent waiting for the next batch from
    the data loader (None when the job does not measure it).
    """

    cpus_per_gpu: int
    gpus: int
    micro_batch: int
    step_time: float
    data_wait: float | None = None


@dataclass(frozen=True)
class JobView:
    """One active (submitted, not finished) job as the controller knows it."""

    job_id: str
    application: str
    submit_time: float
    requested_gpus: int
    requested_batch: int
    min_gpus: int
    max_gpus: int
    min_batch: int
    """Smallest global batch the job trains with (its initial batch size)."""
    max_batch: int
    """Largest global batch the job accepts."""
    min_micro_batch: int
    max_micro_batch: int
    """Per-GPU batch that fits in GPU memory; larger batches use gradient accumulation."""
    max_epochs: int
    """Epochs the user asked for."""
    progress_per_epoch_hint: float
    """One pass over the job's data in progress units (samples / initial batch)."""
    gpus_asked: bool = True
    """False where the user did not say how many GPUs they want: ``requested_gpus`` is then
    the job's minimum, a default rather than a request."""
    length_known: bool = True
    """False while neither the user nor the job has told its length (epochs, dataset
    size): ``max_epochs`` and ``progress_per_epoch_hint`` are then placeholders, and the
    policies count the job as a typical one of the others rather than as almost done."""
    gpus: int = 0
    placement: Mapping[int, int] = field(default_factory=dict)
    batch: int = 0
    micro_batch: int = 0
    accum_steps: int = 1
    epoch: int = 0
    progress: float = 0.0
    """Statistical progress so far (optimizer steps at the initial batch size)."""
    grad_sqr: float | None = None
    grad_var: float | None = None
    """Gradient statistics of the current epoch (noise scale = grad_var / grad_sqr)."""
    grad_history: tuple[tuple[float, float], ...] = ()
    """(grad_sqr, grad_var) reported at the end of each finished epoch."""
    attained_service: float = 0.0
    """GPU-seconds held so far."""
    run_time: float = 0.0
    """Seconds the job has held GPUs."""
    restarts: int = 0
    profile: tuple[StepSample, ...] = ()
    min_cpus_per_gpu: int = 1
    max_cpus_per_gpu: int = 0
    """CPU bounds per GPU; 0 = no upper bound but the node's."""
    cpus_per_gpu: int = 0
    """CPUs per GPU of the current allocation (0 = not known / site default)."""
    cpu_profile: tuple[CpuSample, ...] = ()
    """Step times measured at the CPUs-per-GPU counts the job ran with."""
    predictable: bool = True
    """False for a job that reports no progress: no throughput model can be fitted."""
    resizable: bool = True
    """False for a job that cannot be stopped and resumed now: once running, it keeps its
    GPUs."""
    model_bytes: int = 0
    """Bytes of gradients the job all-reduces per step, as it reports them (0: unknown)."""
    rebatch: bool = True
    """True when the job takes a new global batch at its next step without a restart (the
    runtime's managed mode): a batch-only change is free. False: its batch changes only
    when it is relaunched, so at its current GPUs it keeps the batch it runs with."""
    gpu_type: str = ""
    """The GPU type it runs on now ("" when queued or in a pool of one type)."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types the job accepts (``hpcorch submit --gpu-types``); empty: any."""
    restart_cost_s: float = 0.0
    """Seconds a restart of this job costs as measured on its own launches (its checkpoint,
    exit and start-up); 0: not measured, the pool's ``Snapshot.restart_cost_s``."""
    weight: float = 1.0
    """The job's claim relative to the others (mean 1): its user's fair share split over
    the user's jobs. Inside a reservation Slurm's fairshare no longer orders jobs, so every
    policy orders (or scores) by it; all 1 when every user counts the same."""

    @property
    def running(self) -> bool:
        return self.gpus > 0


@dataclass(frozen=True)
class CompletedJob:
    """A finished job, as kept in the controller's history."""

    job_id: str
    application: str
    jct: float
    gpu_seconds: float
    progress: float
    epochs: int
    profile: tuple[StepSample, ...] = ()
    grad_history: tuple[tuple[float, float], ...] = ()
    cpu_profile: tuple[CpuSample, ...] = ()
    model_bytes: int = 0
    """Gradient bytes per step it reported (0: unknown)."""


@dataclass(frozen=True)
class Snapshot:
    """The input of one scheduling round."""

    now: float
    node_gpus: tuple[int, ...]
    """GPUs per node of the pool (node index = position)."""
    jobs: tuple[JobView, ...]
    history: tuple[CompletedJob, ...] = ()
    round_s: float = 60.0
    restart_cost_s: float = 30.0
    node_cpus: tuple[int, ...] = ()
    """CPUs per node (same order as ``node_gpus``); empty = CPUs not managed."""
    node_types: tuple[str, ...] = ()
    """GPU type per node (same order as ``node_gpus``); empty or all alike: one type."""
    mix_types: bool = False
    """The site's opt-in: one launch may span nodes of two GPU types (it then runs at the
    slowest one's speed); else every plan keeps a job on one type."""
    pool_across_owners: bool = False
    """The site's opt-in: jobs of every owner that report one model fingerprint pool what
    was learned of it (by a vote of owners, :mod:`hpcorch.policy.pooling`); else only one
    owner's jobs pool."""
    limits: Limits = field(default_factory=Limits)
    """The scheduler's limits on each job and on groups of jobs (a user's, an account's):
    every plan keeps within them (:mod:`hpcorch.policy.limits`)."""

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The pool's GPU types, sorted; () when it has one type (or none named)."""
        kinds = tuple(sorted(set(self.node_types)))
        return kinds if len(kinds) > 1 and len(self.node_types) == len(self.node_gpus) else ()

    def type_of(self, placement: Mapping[int, int]) -> str:
        """The GPU type of the nodes of ``placement`` ("" untyped, "+"-joined if mixed)."""
        if not self.gpu_types:
            return ""
        return joined(self.node_types[n] for n in placement)

    @property
    def manages_cpus(self) -> bool:
        return len(self.node_cpus) == len(self.node_gpus) > 0

    def site_cpus_per_gpu(self, placement: Mapping[int, int]) -> int:
        """The site default on ``placement``: node CPUs / node GPUs, least over its nodes."""
        return min(
            (self.node_cpus[n] // max(self.node_gpus[n], 1) for n in placement),
            default=0,
        )


@dataclass(frozen=True)
class JobPlan:
    """One job's allocation: GPUs, placement {node -> GPUs} (in rank order) and batch."""

    job_id: str
    gpus: int
    placement: Mapping[int, int]
    global_batch: int
    micro_batch: int
    accum_steps: int
    cpus_per_gpu: int = 0
    """CPUs per GPU; 0 = leave as is (a job that moves or starts gets the site default)."""
    gpu_type: str = ""
    """The GPU type of its nodes, which its launch requests ("" in a pool of one type)."""


@dataclass(frozen=True)
class Plan:
    """The output of one round. Jobs not listed get no GPUs (queued or preempted)."""

    jobs: tuple[JobPlan, ...] = ()

    def by_id(self) -> dict[str, JobPlan]:
        return {p.job_id: p for p in self.jobs}

    @property
    def gpus_used(self) -> int:
        return sum(p.gpus for p in self.jobs)


class Policy(Protocol):
    """A scheduling policy: stateless, or with its state held explicitly in the object."""

    name: str

    def schedule(self, snapshot: Snapshot) -> Plan: ...


class PlanError(ValueError):
    """A plan that the pool cannot honour."""


def validate_plan(snapshot: Snapshot, plan: Plan) -> None:
    """Raise :class:`PlanError` unless ``plan`` fits the pool and every job's bounds."""
    jobs = {j.job_id: j for j in snapshot.jobs}
    used = [0] * len(snapshot.node_gpus)
    seen: set[str] = set()
    for p in plan.jobs:
        job = jobs.get(p.job_id)
        if job is None:
            raise PlanError(f"plan names unknown job {p.job_id!r}")
        if p.job_id in seen:
            raise PlanError(f"plan names job {p.job_id!r} twice")
        seen.add(p.job_id)
        if p.gpus != sum(p.placement.values()) or p.gpus < 1:
            raise PlanError(f"{p.job_id}: placement {dict(p.placement)} != {p.gpus} GPUs")
        if not job.min_gpus <= p.gpus <= job.max_gpus:
            raise PlanError(
                f"{p.job_id}: {p.gpus} GPUs outside bounds {job.min_gpus}..{job.max_gpus}"
            )
        if p.micro_batch * p.accum_steps * p.gpus != p.global_batch:
            raise PlanError(f"{p.job_id}: batch split does not multiply to {p.global_batch}")
        if not 1 <= p.micro_batch <= job.max_micro_batch:
            raise PlanError(f"{p.job_id}: micro-batch {p.micro_batch} > {job.max_micro_batch}")
        for node, n in p.placement.items():
            if not 0 <= node < len(used) or n < 1:
                raise PlanError(f"{p.job_id}: bad placement {dict(p.placement)}")
            used[node] += n
        _validate_type(snapshot, job, p)
    for node, n in enumerate(used):
        if n > snapshot.node_gpus[node]:
            raise PlanError(f"node {node}: {n} GPUs planned, {snapshot.node_gpus[node]} exist")
    if snapshot.manages_cpus:
        _validate_cpus(snapshot, plan, jobs)


def _validate_type(snapshot: Snapshot, job: JobView, p: JobPlan) -> None:
    """One type per launch (unless the site mixes), of a type the job accepts."""
    if not snapshot.gpu_types:
        return
    kinds = {snapshot.node_types[n] for n in p.placement}
    if len(kinds) > 1 and not snapshot.mix_types:
        raise PlanError(f"{p.job_id}: placement spans GPU types {', '.join(sorted(kinds))}")
    if job.gpu_types and not kinds <= set(job.gpu_types):
        raise PlanError(
            f"{p.job_id}: on {', '.join(sorted(kinds))}, accepts {', '.join(job.gpu_types)}"
        )
    if p.gpu_type and p.gpu_type != snapshot.type_of(p.placement):
        raise PlanError(f"{p.job_id}: gpu_type {p.gpu_type} is not its nodes' type")


def planned_cpus_per_gpu(snapshot: Snapshot, job: JobView, plan: JobPlan) -> int:
    """CPUs per GPU the job gets under ``plan``: the plan's, else its current count if it
    stays where it is, else the site default on its new placement."""
    if plan.cpus_per_gpu > 0:
        return plan.cpus_per_gpu
    if job.cpus_per_gpu > 0 and dict(plan.placement) == dict(job.placement):
        return job.cpus_per_gpu
    return snapshot.site_cpus_per_gpu(plan.placement)


def _validate_cpus(snapshot: Snapshot, plan: Plan, jobs: Mapping[str, JobView]) -> None:
    used = [0] * len(snapshot.node_cpus)
    for p in plan.jobs:
        job = jobs[p.job_id]
        c = p.cpus_per_gpu
        if c < 0:
            raise PlanError(f"{p.job_id}: negative CPUs per GPU {c}")
        if c and (c < job.min_cpus_per_gpu or 0 < job.max_cpus_per_gpu < c):
            hi = job.max_cpus_per_gpu or "node"
            raise PlanError(
                f"{p.job_id}: {c} CPUs per GPU outside bounds {job.min_cpus_per_gpu}..{hi}"
            )
        per_gpu = planned_cpus_per_gpu(snapshot, job, p)
        for node, n in p.placement.items():
            used[node] += n * per_gpu
    for node, n in enumerate(used):
        if n > snapshot.node_cpus[node]:
            raise PlanError(f"node {node}: {n} CPUs planned, {snapshot.node_cpus[node]} exist")
