"""The simulated cluster: advances time and reports only what real jobs would report.

No policy logic lives here. :meth:`SimCluster.advance` runs every placed job for some
seconds on its true (trace-interpolated) behaviour; :meth:`SimCluster.reports` returns what
the jobs would tell a controller; :meth:`SimCluster.apply` enacts a plan, charging the
restart cost to every job whose GPUs, placement or CPUs change.

Data loading: a job of an application with a CPU demand of ``d`` seconds of CPU work per
sample loads a micro-batch of ``b`` samples in ``b x d / c`` seconds on its ``c`` CPUs per
GPU, overlapped with compute, so a micro-step takes ``max(compute, loading)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hpcorch.policy.types import CompletedJob, CpuSample, JobView, Plan, StepSample
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob


@dataclass
class SimJob:
    """Mutable state of one simulated job (ground truth)."""

    spec: WorkloadJob
    app: AppTrace
    placement: tuple[tuple[int, int], ...] = ()
    batch: int = 0
    micro_batch: int = 0
    accum_steps: int = 1
    progress: float = 0.0
    epoch: int = 0
    rescale_left: float = 0.0
    attained_service: float = 0.0
    run_time: float = 0.0
    idle_held: float = 0.0
    """GPU-seconds held after completion, until the next round frees them."""
    restarts: int = -1
    start_time: float | None = None
    completion_time: float | None = None
    grad: tuple[float, float] | None = None
    grad_history: list[tuple[float, float]] = field(default_factory=list)
    profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    cpu_s_per_sample: float = 0.0
    """Seconds of data-loading CPU work per sample (0: loading never holds a step up)."""
    cpus_per_gpu: int = 0
    """CPUs per GPU of the current allocation (0: not modelled, loading is free)."""
    cpu_profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    """(CPUs per GPU, GPUs, micro-batch) -> (seconds per micro-step, input wait of it)."""
    segment: tuple[float, float, float, float] | None = None
    """(start, progress then, goodput, time reached) of the stretch of steady training the
    job is in: an epoch ends a whole number of seconds (its application's
    ``epoch_grain_s``) after the stretch began, however the stretch is cut into calls of
    :meth:`step`."""

    @property
    def gpus(self) -> int:
        return sum(n for _, n in self.placement)

    @property
    def done(self) -> bool:
        return self.completion_time is not None

    def counts(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.placement)

    def load_time(self) -> float:
        """Seconds the job's CPUs take to load one micro-batch (for one GPU)."""
        if self.cpu_s_per_sample <= 0 or self.cpus_per_gpu <= 0:
            return 0.0
        return self.micro_batch * self.cpu_s_per_sample / self.cpus_per_gpu

    def iteration_time(self) -> tuple[float, float]:
        """(seconds per optimizer step, the part of it without input waits).

        Each micro-step waits for its micro-batch if loading takes longer than computing
        it (the last one's compute includes the all-reduce).
        """
        st, sy = self.app.step_time(self.counts(), self.micro_batch)
        compute = st + (self.accum_steps - 1) * (st - sy)
        load = self.load_time()
        if load <= 0:
            return compute, compute
        return max(st, load) + (self.accum_steps - 1) * max(st - sy, load), compute

    def time_to_finish(self, now: float | None = None) -> float:
        """Seconds until the job completes if it keeps its configuration (inf without
        GPUs): the arithmetic of :meth:`step` in one go. ``now``: the time the job has been
        run to, to continue its stretch of steady training."""
        if not self.gpus or self.done:
            return float("inf")
        app = self.app
        it = self.iteration_time()[0]
        t, progress = self.rescale_left, self.progress
        seg = self.segment
        for epoch in range(self.epoch, app.epochs):
            goodput = app.gain(self.batch, epoch) / it
            nxt = float(app.epoch_end[epoch + 1])
            t0, p0 = t, progress
            steady = seg is not None and now is not None and t == 0 and seg[2] == goodput
            if steady and seg is not None and now is not None and abs(seg[3] - now) <= 1e-6:
                t0, p0 = seg[0] - now, seg[1]  # the epoch's end was fixed when it began
            seg = None
            t = t0 + max(_grained((nxt - p0) / goodput, app.epoch_grain_s), 0.0)
            t = max(t, 0.0)
            progress = nxt
        return t

    def step(self, now: float, seconds: float) -> None:
        """Run for ``seconds`` starting at ``now`` (true behaviour from the traces)."""
        g = self.gpus
        if not g:
            return
        if self.done:
            self.idle_held += g * seconds
            return
        delay = min(self.rescale_left, seconds)
        self.rescale_left -= delay
        self.attained_service += g * delay
        self.run_time += delay
        t = now + delay
        seconds -= delay
        app = self.app
        counts = self.counts()
        nodes = len(counts)
        while seconds > 0 and not self.done:
            st, sy = app.step_time(counts, self.micro_batch)
            key = (nodes, g, self.micro_batch)
            if key not in self.profile:
                self.profile[key] = (st, sy)
            it, compute = self.iteration_time()
            if self.cpus_per_gpu > 0:
                ckey = (self.cpus_per_gpu, g, self.micro_batch)
                if ckey not in self.cpu_profile:
                    k = self.accum_steps
                    self.cpu_profile[ckey] = (it / k, (it - compute) / k)
            self.grad = app.grad_stats(self.batch, self.epoch)
            goodput = app.gain(self.batch, self.epoch) / it
            nxt = float(app.epoch_end[self.epoch + 1])
            seg = self.segment
            if seg is None or seg[2] != goodput or abs(seg[3] - t) > 1e-6:
                seg = (t, self.progress, goodput, t)  # a new stretch: from here, at this speed
            t0, p0 = seg[0], seg[1]
            end = t0 + max(_grained((nxt - p0) / goodput, app.epoch_grain_s), 0.0)
            if end > t + seconds:
                self.progress = p0 + goodput * (t + seconds - t0)
                used = seconds
                self.segment = (t0, p0, goodput, t + seconds)
            else:
                used = max(end - t, 0.0)
                self.grad_history.append(self.grad)
                self.epoch += 1
                self.progress = nxt
                self.segment = (t + used, nxt, -1.0, t + used)  # the next epoch starts here
                if self.epoch >= app.epochs:
                    self.completion_time = t + used
            self.attained_service += g * used
            self.run_time += used
            t += used
            seconds -= used
        if self.completion_time is not None:
            self.idle_held += g * seconds


class SimCluster:
    """A pool of nodes running the jobs of one workload."""

    def __init__(
        self,
        jobs: list[WorkloadJob],
        apps: Mapping[str, AppTrace],
        node_gpus: tuple[int, ...],
        restart_cost: float = 30.0,
        node_cpus: tuple[int, ...] = (),
        cpu_demand: Mapping[str, float] | None = None,
    ) -> None:
        self.node_gpus = node_gpus
        self.node_cpus = node_cpus
        self.restart_cost = restart_cost
        self.now = 0.0
        demand = cpu_demand or {}
        self.jobs = [
            SimJob(
                spec=j,
                app=apps[j.application],
                cpu_s_per_sample=demand.get(j.application, 0.0),
            )
            for j in jobs
        ]
        self._by_id = {j.spec.name: j for j in self.jobs}
        self.allocated_gpu_seconds = 0.0
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
        self._completed: dict[str, CompletedJob] = {}

    # -- time -----------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        self.allocated_gpu_seconds += seconds * sum(j.gpus for j in self.jobs)
        for job in self.jobs:
            job.step(self.now, seconds)
        self.now += seconds

    def all_done(self) -> bool:
        return all(j.done for j in self.jobs)

    def active(self) -> list[SimJob]:
        return [j for j in self.jobs if j.spec.time <= self.now and not j.done]

    # -- observation ----------------------------------------------------------------------
    def reports(self, max_gpus: int | None = None) -> list[JobView]:
        """What each active job reports (request, bounds, measurements, progress)."""
        total = sum(self.node_gpus)
        out = []
        for j in self.active():
            app = j.app
            cap = min(total, max_gpus or total, app.max_batch // app.min_micro)
            out.append(
                JobView(
                    job_id=j.spec.name,
                    application=j.spec.application,
                    submit_time=j.spec.time,
                    requested_gpus=j.spec.num_replicas,
                    requested_batch=j.spec.batch_size,
                    min_gpus=1,
                    max_gpus=max(cap, min(j.spec.num_replicas, total)),
                    min_batch=app.init_batch,
                    max_batch=app.max_batch,
                    min_micro_batch=app.min_micro,
                    max_micro_batch=app.max_micro,
                    max_epochs=app.epochs,
                    progress_per_epoch_hint=app.progress_per_epoch_hint,
                    gpus=j.gpus,
                    placement=dict(j.placement),
                    batch=j.batch,
                    micro_batch=j.micro_batch,
                    accum_steps=j.accum_steps,
                    epoch=j.epoch,
                    progress=j.progress,
                    grad_sqr=j.grad[0] if j.grad else None,
                    grad_var=j.grad[1] if j.grad else None,
                    grad_history=tuple(j.grad_history),
                    attained_service=j.attained_service,
                    run_time=j.run_time,
                    restarts=max(j.restarts, 0),
                    profile=_samples(j),
                    cpus_per_gpu=j.cpus_per_gpu,
                    cpu_profile=_cpu_samples(j),
                    model_bytes=app.model_bytes,
                )
            )
        return out

    def completed(self) -> list[CompletedJob]:
        for j in self.jobs:
            if j.done and j.spec.name not in self._completed:
                self._completed[j.spec.name] = self._record(j)
        return list(self._completed.values())

    @staticmethod
    def _record(j: SimJob) -> CompletedJob:
        return CompletedJob(
            job_id=j.spec.name,
            application=j.spec.application,
            jct=(j.completion_time or 0.0) - j.spec.time,
            gpu_seconds=j.attained_service,
            progress=j.progress,
            epochs=j.epoch,
            profile=_samples(j),
            grad_history=tuple(j.grad_history),
            cpu_profile=_cpu_samples(j),
            model_bytes=j.app.model_bytes,
        )

    # -- actuation ------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        """Enact ``plan``: unplanned jobs lose their GPUs; changed placements restart."""
        planned = plan.by_id()
        for j in self.jobs:
            p = planned.get(j.spec.name)
            new = tuple(p.placement.items()) if p is not None else ()
            if j.done:
                j.placement = ()
                j.cpus_per_gpu = 0
                continue
            cpus = self._cpus(j, new, p.cpus_per_gpu if p is not None else 0)
            if new != j.placement or cpus != j.cpus_per_gpu:
                j.placement = new
                j.cpus_per_gpu = cpus
                if new:
                    j.rescale_left = self.restart_cost
                    j.restarts += 1
                    if j.start_time is None:
                        j.start_time = self.now
            if p is not None:
                j.batch, j.micro_batch, j.accum_steps = (
                    p.global_batch,
                    p.micro_batch,
                    p.accum_steps,
                )
        self.timeline.append((self.now, sum(j.gpus for j in self.jobs)))

    def _cpus(self, j: SimJob, placement: tuple[tuple[int, int], ...], planned: int) -> int:
        """CPUs per GPU a job gets: the plan's, else its own if it stays, else the site's."""
        if not placement or not self.node_cpus:
            return 0
        if planned > 0:
            return planned
        if placement == j.placement and j.cpus_per_gpu > 0:
            return j.cpus_per_gpu
        return min(self.node_cpus[n] // max(self.node_gpus[n], 1) for n, _ in placement)


def _grained(seconds: float, grain: float) -> float:
    """``seconds`` rounded to a whole number of ``grain`` (an epoch's length: whole seconds,
    a replay's time scale of them)."""
    return float(round(seconds / grain)) * grain


def _cpu_samples(j: SimJob) -> tuple[CpuSample, ...]:
    return tuple(
        CpuSample(cpus_per_gpu=k[0], gpus=k[1], micro_batch=k[2], step_time=v[0], data_wait=v[1])
        for k, v in j.cpu_profile.items()
    )


def _samples(j: SimJob) -> tuple[StepSample, ...]:
    return tuple(
        StepSample(nodes=k[0], gpus=k[1], micro_batch=k[2], step_time=v[0], sync_time=v[1])
        for k, v in j.profile.items()
    )
