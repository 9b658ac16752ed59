"""The simulated side of the cluster seam: Slurm's semantics on a simulated clock.

:class:`SimSlurm` implements :class:`hpcorch.cluster.Cluster` over the engine's true job
models (:class:`hpcorch.sim.engine.SimJob`), so the production controller can run on it:

* a workload job appears when its arrival time has passed, PENDING and held, with the
  hpcorch comment a managed submission carries (min, max, batch, maxbatch, micro, app, dir)
  plus the user's request (req GPUs, reqbatch) for the policies that honour requests;
* ``start`` gives a held job its shape and releases it; it runs as soon as the GPUs of its
  shape are free (at once when they are): exactly ``Shape.per_node`` GPUs on each of
  ``Shape.node_names`` (rank order) when the shape names them, else the even shape on the
  nodes Slurm picks; it reads the last plan written to its job directory, spends
  ``cost.startup(GPUs)`` starting up (no progress) and then trains;
* ``signal_checkpoint``: the job stops training, checkpoints and requeues itself held in
  the SPECIAL_EXIT state (restarts + 1), as hpcorch's wrapper does,
  ``cost.checkpoint_s + cost.exit_s`` later, holding its GPUs until then;
  ``requeue_hold`` puts an ended job back in the queue, held, restarts + 1 (a running one is
  killed and loses what it did since its last checkpoint); ``hold`` and ``cancel`` as in
  Slurm;
* ``write_plan`` of a running job's own launch number (a batch-only change) is taken at
  the job's next step, without a restart, as the runtime does;
* ``read_metrics`` returns the lines a real job writes (:mod:`hpcorch.sim.job_side`): a
  ``start`` event once training begins (its model; epochs and dataset size unless the job
  declares no length: ``declares``), then ``steps`` lines at most every ``report_s``
  seconds (measured step time at the current configuration, step count, epoch, batch
  split, samples/s and the gradient noise scale);
* a job that reaches its last epoch exits 0 (COMPLETED) and frees its GPUs,
  ``cost.finish_s`` after its last step (its final checkpoint and teardown).

What squeue shows of a job and where a released launch fits are in
:mod:`hpcorch.sim.slurm_view`. Ended jobs stay visible for ``min_job_age`` seconds, like
Slurm's MinJobAge.
:meth:`SimSlurm.next_event` tells a driver when the next thing a controller could see
happens, so it can skip the cycles in which nothing would.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpcorch.cluster import Observation, PoolNode, Shape
from hpcorch.errors import HpcorchError
from hpcorch.planner import LaunchPlan
from hpcorch.protocol import EXIT_DONE
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.gputypes import TypedPool
from hpcorch.sim.job_side import checkpoint, flush, iteration_time, line, report, restore, set_batch
from hpcorch.sim.limits import LimitGate, SimLimits
from hpcorch.sim.slurm_jobs import INF, SlurmJob, job_tags
from hpcorch.sim.slurm_view import cpus_per_gpu, fit_shape, observed
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

FIRST_JOB_ID = 1000
JOB_DIR_PREFIX = "/sim/"
"""Simulated job directories: plain absolute paths, as the controller accepts."""
FIRST_LINE_S = 5.0
"""A launch's first line comes at most this long after it starts training (sooner where the
world is advanced to another event in between), and a job's first line at a batch it was
given live this long after the change (the runtime writes a line every metrics interval,
5 s, and closes one at a change); later lines every ``report_s``."""
FINISHED = ("COMPLETED", "CANCELLED")
"""The states of a job that is done for good (a requeued one is PENDING again)."""


class SimSlurmError(HpcorchError):
    """An action the simulated Slurm refuses (as scontrol would)."""


class SimSlurm:
    """A pool of ``node_gpus`` nodes under a simulated Slurm, running ``jobs``."""

    def __init__(
        self,
        jobs: Sequence[WorkloadJob],
        apps: Mapping[str, AppTrace],
        node_gpus: tuple[int, ...],
        cost: ResizeCost | None = None,
        report_s: float = 60.0,
        min_job_age: float = 300.0,
        user: str = "sim",
        node_cpus: tuple[int, ...] = (),
        cpu_demand: Mapping[str, float] | None = None,
        fixed_cpus: int = 0,
        typed: TypedPool | None = None,
        declares: Callable[[int], bool] | None = None,
        limits: SimLimits | None = None,
    ) -> None:
        """``declares(i)``: whether the ``i``-th job of ``jobs`` declares its length
        (its comment and its start event carry epochs and dataset size; default: all)."""
        self.cost = cost or ResizeCost()
        self.limits = limits
        """Slurm's limits on the jobs, each job's user (None: none, one user)."""
        self.gate = LimitGate(limits)
        self.limit_waits = self.gate.waits
        """How long each launch kept pending for a limit was so (seconds)."""
        self.world = SimCluster(
            list(jobs), apps, node_gpus, self.cost.startup_s, node_cpus, cpu_demand
        )
        self.node_gpus = node_gpus
        self.node_cpus = node_cpus
        """CPUs per node (empty: CPUs are not modelled)."""
        self.fixed_cpus = fixed_cpus
        """CPUs per GPU every job script fixes (0: the shape's, else the site default)."""
        self.typed = typed
        """Nodes of several GPU types (None: one type, the traces')."""
        self.node_names = tuple(f"sim{i:03d}" for i in range(len(node_gpus)))
        self._index = {n: i for i, n in enumerate(self.node_names)}
        self.report_s = report_s
        self.min_job_age = min_job_age
        self.user = user
        total = sum(node_gpus)
        self.jobs: list[SlurmJob] = []
        self._by_id: dict[int, SlurmJob] = {}
        self._by_dir: dict[str, SlurmJob] = {}
        for i, model in enumerate(self.world.jobs):
            sid = FIRST_JOB_ID + i
            job_dir = f"{JOB_DIR_PREFIX}{model.spec.name}"
            says = declares is None or declares(i)
            tags = job_tags(model.spec, model.app, total, job_dir, says)
            sj = SlurmJob(sid, model, tags, declares_length=says)
            sj.user = limits.user(i) if limits is not None else user
            self.jobs.append(sj)
            self._by_id[sid] = sj
            self._by_dir[job_dir] = sj
        self._arrivals = sorted(j.model.spec.time for j in self.jobs)
        self._running: list[SlurmJob] = []
        self._waiting: list[SlurmJob] = []
        """Released pending jobs, in the order Slurm considers them (job id)."""
        self._admin_held: set[int] = set()
        """Jobs under the controller's own (admin) hold, as an operator's hold is."""
        self._finished = 0
        self._calls = 0
        self._changes = 0
        """Changes Slurm would show; :meth:`observe` notes how many it has shown."""
        self._shown = 0

    # --- the Cluster protocol -----------------------------------------------------------
    @property
    def calls(self) -> int:
        return self._calls

    @property
    def call_seconds(self) -> float:
        return 0.0  # the simulated Slurm answers at once

    def longest_call(self) -> float:
        return 0.0

    def ping(self) -> None:
        self._calls += 1

    def now(self) -> float:
        return self.world.now

    def observe(self) -> Observation:
        self._calls += 2  # squeue + sinfo
        self._shown = self._changes
        now = self.world.now
        used = self._used()[0]
        # CPUs fixed by every job script: the controller is not told them, so plans none
        cpus = self.node_cpus if self.node_cpus and not self.fixed_cpus else (0,) * len(used)
        nodes = tuple(
            PoolNode(name, g, used[i], True, cpus[i], gpu_type=self._type(i))
            for i, (name, g) in enumerate(zip(self.node_names, self.node_gpus, strict=True))
        )
        seen = []
        for j in self.jobs:
            if j.model.spec.time > now or (j.ended and now - j.end_time > self.min_job_age):
                continue
            if j.seen is None or j.seen[0] != j.version:
                j.seen = (j.version, observed(j, self.node_names, self._admin_held))
            seen.append(j.seen[1])
        if self.limits is None:
            return Observation(time=now, nodes=nodes, jobs=tuple(seen))
        book = self.limits.book(((o.slurm_id, o.user) for o in seen if not o.ended), now)
        return Observation(time=now, nodes=nodes, jobs=tuple(seen), limits=book)

    def start(self, slurm_id: int, shape: Shape) -> None:
        self._calls += 3  # update shape, StartTime, release
        j = self._job(slurm_id)
        if j.state != "PENDING":
            raise SimSlurmError(f"job {slurm_id}: job is not pending ({j.state})")
        if shape.nodes < 1 or shape.gpus_per_node < 1:
            raise SimSlurmError(f"job {slurm_id}: invalid shape {shape}")
        if shape.node_names and any(n not in self._index for n in shape.node_names):
            raise SimSlurmError(f"job {slurm_id}: invalid node name in {shape.node_names}")
        if shape.per_node and (
            len(shape.per_node) != len(shape.node_names) or min(shape.per_node) < 1
        ):
            raise SimSlurmError(f"job {slurm_id}: invalid placement {shape}")
        if shape.gpu_type and any(
            self._type(self._index[n]) != shape.gpu_type for n in shape.node_names
        ):
            raise SimSlurmError(f"job {slurm_id}: nodes without gres gpu:{shape.gpu_type}")
        j.shape = shape
        j.held = j.special_exit = False
        self._bump(j)
        if j not in self._waiting:
            self._waiting.append(j)
            self._waiting.sort(key=lambda w: w.slurm_id)
        self._dispatch()

    def flush(self, send: bool = True) -> dict[int, str]:
        return {}  # every action took effect when it was made

    def hold(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        if j.state != "PENDING":
            raise SimSlurmError(f"job {slurm_id}: job is no longer pending execution")
        j.held = True
        self._admin_held.add(slurm_id)
        self._bump(j)
        self._unwait(j)
        self.gate.clear(j, self.world.now)

    def signal_checkpoint(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        if j.state != "RUNNING":
            raise SimSlurmError(f"job {slurm_id}: job is not running ({j.state})")
        now = self.world.now
        j.signalled_at = now
        if j.stop_at is None:
            flush(j, now)
            j.first_signal = now
            j.stop_at = now + self.cost.stop_s
            j.finish_at = INF

    def requeue_hold(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        self._admin_held.discard(slurm_id)  # Slurm leaves a requeue-hold a user hold
        self._bump(j)
        if j.state == "PENDING":
            j.held = True
            self._unwait(j)
            self.gate.clear(j, self.world.now)
            return
        if j.state == "RUNNING":  # killed: back to its last checkpoint, queued again (not
            self._end(j, "PENDING", 0, self.world.now)  # a finished job: REQUEUE_HOLD)
            restore(j)
        j.state, j.held, j.exit_code = "PENDING", True, 0
        j.restarts += 1
        j.nodes = j.counts = ()

    def cancel(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        if not j.ended:
            self._unwait(j)
            self.gate.clear(j, self.world.now)
            self._end(j, "CANCELLED", 0, self.world.now)
            j.held = False

    def allow_requeue(self, slurm_id: int) -> None:
        self._calls += 1  # every simulated job can be requeued

    def locate(self, slurm_ids: Sequence[int]) -> dict[int, str]:
        return {}  # no simulated job ever leaves the pool

    def write_plan(self, slurm_id: int, plan: LaunchPlan, uid: int) -> None:
        j = self._job(slurm_id)
        j.plan = plan
        if j.state == "RUNNING" and plan.launch == j.launches - 1 and plan.gpus == j.gpus:
            self._rebatch(j, plan)

    def read_metrics(self, job_dir: str, offset: int, uid: int) -> tuple[list[dict[str, Any]], int]:
        j = self._by_dir.get(job_dir)
        if j is None:
            return [], offset
        return j.lines[offset:], len(j.lines)

    # --- the simulated world ------------------------------------------------------------
    def all_done(self) -> bool:
        return self._finished == len(self.jobs)

    def unfinished(self) -> list[SlurmJob]:
        """The jobs in none of the states :attr:`_finished` counts (read from each job: a
        check on the count)."""
        return [j for j in self.jobs if j.state not in FINISHED]

    def next_event(self) -> float:
        """When the next thing a controller could observe happens (inf: nothing more):
        an arrival, a checkpointed job's exit, a launch starting to train, a job's first
        line at a batch it was given live, a completion.

        Completions are predicted a second early (epoch ends are rounded to seconds), so
        the time is never later than the event."""
        now = self.world.now
        if self._changes != self._shown:  # e.g. a start the last cycle asked for: running now
            return now
        i = bisect.bisect_right(self._arrivals, now)
        nxt = self._arrivals[i] if i < len(self._arrivals) else INF
        for j in self._running:
            if j.stop_at is not None:
                nxt = min(nxt, j.stop_at)
            elif not j.training:
                nxt = min(nxt, j.train_at)
            else:
                nxt = min(nxt, max(self._finish(j) - 1.0, now + 1e-6), j.line_due)
        return nxt

    def _finish(self, j: SlurmJob) -> float:
        """When the running job completes: predicted at its launch, predicted again from
        where it is once that time is near (epoch ends are rounded to whole seconds as the
        job runs, so a long prediction drifts by a few seconds)."""
        now = self.world.now
        if j.stop_at is None and j.finish_at - 1.0 <= now:
            j.finish_at = now + j.model.time_to_finish(now)
        return j.finish_at

    def arrived_unfinished(self) -> bool:
        """Whether some job has arrived and not finished (a controller has work)."""
        return bisect.bisect_right(self._arrivals, self.world.now) > self._finished

    def awaiting_relaunch(self) -> list[SlurmJob]:
        """Jobs that exited (failed) or requeued themselves after a checkpoint, and were not
        started again yet."""
        return [j for j in self.jobs if j.state == "FAILED" or j.special_exit]

    def stopping(self) -> list[SlurmJob]:
        """Running jobs that were signalled to checkpoint."""
        return [j for j in self._running if j.stop_at is not None]

    def advance(self, seconds: float) -> None:
        """Run the world for ``seconds``."""
        self.advance_to(self.world.now + seconds)

    def advance_to(self, end: float) -> None:
        """Run the world to ``end``: training, checkpoint exits, completions and the launches
        of released jobs whose GPUs they free, each at its own time."""
        while True:
            now = self.world.now
            for j in [r for r in self._running if r.stop_at is not None and r.stop_at <= now]:
                if j.model.completion_time is not None:  # its last step was before: it ends
                    self._end(j, "COMPLETED", EXIT_DONE, j.stop_at or now)
                    continue
                checkpoint(j)
                self._requeue_self(j, j.stop_at or now)
            self._dispatch()
            if now >= end:
                break
            nxt = end
            for j in self._running:
                t = j.stop_at if j.stop_at is not None else self._finish(j)
                if now < t < nxt:
                    nxt = t
            self._run(nxt - now)
            self.world.now = nxt
        self.world.timeline.append((self.world.now, sum(j.gpus for j in self._running)))

    def _run(self, dt: float) -> None:
        if dt <= 0:
            return
        now = self.world.now
        self.world.allocated_gpu_seconds += dt * sum(j.gpus for j in self._running)
        for j in list(self._running):
            m = j.model
            if j.stop_at is not None:  # checkpointing: GPUs held, no progress
                m.attained_service += m.gpus * dt
                m.run_time += dt
                continue
            before_run, before_delay = m.run_time, m.rescale_left
            m.step(now, dt)
            startup = before_delay - m.rescale_left
            trained = m.run_time - before_run - startup
            if not j.training and m.rescale_left <= 0:
                j.training = True
                line(j, now + startup, "start")
                j.line_due = now + startup + FIRST_LINE_S  # the runtime's first interval
            if trained > 0:
                it = iteration_time(j)
                j.steps += trained / it
                j.win_steps += trained / it
                j.win_seconds += trained
            if m.completion_time is not None:
                report(j, m.completion_time, force=True)
                line(j, m.completion_time, "done")
                if self.cost.finish_s > 0:  # ends in Slurm later, holding its GPUs till then
                    j.stop_at = m.completion_time + self.cost.finish_s
                    j.finish_at = INF
                else:
                    self._end(j, "COMPLETED", EXIT_DONE, m.completion_time)
            elif j.win_seconds > 0 and (
                now + dt - j.last_line >= self.report_s or now + dt >= j.line_due
            ):
                report(j, now + dt)
                j.line_due = INF

    # --- launches -----------------------------------------------------------------------
    def _used(self) -> tuple[list[int], list[int]]:
        """GPUs and CPUs in use on each node."""
        gpus, cpus = [0] * len(self.node_gpus), [0] * len(self.node_gpus)
        for j in self._running:
            for i, c in zip(j.nodes, j.counts, strict=True):
                gpus[i] += c
                cpus[i] += c * j.model.cpus_per_gpu
        return gpus, cpus

    def _dispatch(self) -> None:
        """Start released pending jobs whose GPUs (and CPUs) are free (job id order, no
        backfill)."""
        if not self._waiting:
            return
        used, used_cpus = self._used()
        for j in list(self._waiting):
            assert j.shape is not None
            if self._refused(j):
                continue
            free = [g - u for g, u in zip(self.node_gpus, used, strict=True)]
            where = fit_shape(j.shape, free, self._index, self._type)
            if where is None:
                continue
            per_gpu = cpus_per_gpu(
                j.shape, where[0], self.node_cpus, self.node_gpus, self.fixed_cpus
            )
            if self.node_cpus and any(
                used_cpus[i] + c * per_gpu > self.node_cpus[i] for i, c in zip(*where, strict=True)
            ):
                continue
            for i, c in zip(*where, strict=True):
                used[i] += c
                used_cpus[i] += c * per_gpu
            j.model.cpus_per_gpu = per_gpu
            self._launch(j, *where)

    def _refused(self, j: SlurmJob) -> bool:
        """Kept pending for a limit (:class:`hpcorch.sim.limits.LimitGate`)."""
        if self.gate.limits is None:  # (the gate checks too: this spares the list below,
            return False  # built for every released job at every dispatch)
        if self.gate.check(j, [(r.user, r.gpus) for r in self._running], self.world.now):
            self._bump(j)
        return bool(j.refused)

    def _launch(self, j: SlurmJob, nodes: tuple[int, ...], counts: tuple[int, ...]) -> None:
        m = j.model
        now = self.world.now
        self._unwait(j)
        j.state, j.held, j.nodes, j.counts = "RUNNING", False, nodes, counts
        j.start_time, j.stop_at, j.training = now, None, False
        j.launches += 1
        self._bump(j)
        if j.first_start is None:
            j.first_start = now
        self._running.append(j)
        m.placement = tuple(zip(nodes, counts, strict=True))
        if self.typed is not None:
            m.app = self.typed.app_on(m.spec.application, nodes)
        set_batch(j, j.plan)
        m.rescale_left = self.cost.startup(sum(counts))
        j.train_at = now + m.rescale_left
        m.restarts += 1
        if m.start_time is None:
            m.start_time = now
        j.win_steps = j.win_seconds = 0.0
        j.last_line = -1e18
        j.line_due = INF
        j.finish_at = now + m.time_to_finish(now)

    def _rebatch(self, j: SlurmJob, plan: LaunchPlan) -> None:
        """A new global batch for the running launch, taken at its next step."""
        now = self.world.now
        flush(j, now)
        set_batch(j, plan)
        j.line_due = now + FIRST_LINE_S
        if j.stop_at is None:
            j.finish_at = now + j.model.time_to_finish(now)

    def _bump(self, j: SlurmJob) -> None:
        j.version += 1
        self._changes += 1

    def _unwait(self, j: SlurmJob) -> None:
        if j in self._waiting:
            self._waiting.remove(j)

    def _end(self, j: SlurmJob, state: str, code: int, at: float) -> None:
        if j in self._running:
            self._running.remove(j)
        j.state, j.exit_code, j.end_time, j.stop_at = state, code, at, None
        j.model.placement = ()
        j.training = False
        j.train_at = j.finish_at = INF
        self._bump(j)
        if state in FINISHED:
            self._finished += 1

    def _requeue_self(self, j: SlurmJob, at: float) -> None:
        """What hpcorch's job wrapper does after a checkpoint on request: the job requeues
        itself held in SPECIAL_EXIT (restarts + 1) and frees its GPUs."""
        self._end(j, "PENDING", 0, at)
        j.held = j.special_exit = True
        j.restarts += 1
        j.nodes = j.counts = ()
        self._admin_held.discard(j.slurm_id)

    def _type(self, node: int) -> str:
        return self.typed.node_types[node] if self.typed is not None else ""

    def _job(self, slurm_id: int) -> SlurmJob:
        j = self._by_id.get(slurm_id)
        if j is None or j.model.spec.time > self.world.now:
            raise SimSlurmError(f"invalid job id {slurm_id}")
        return j
