"""The simulated side of the cluster seam: Slurm's semantics on a simulated clock.

:class:`SimSlurm` implements :class:`hpcorch.cluster.Cluster` over the engine's true job
models (:class:`hpcorch.sim.engine.SimJob`), so the production controller can run on it:

* a workload job appears when its arrival time has passed, PENDING and held, with the
  hpcorch comment a managed submission carries (min, max, batch, maxbatch, micro, app, dir)
  plus the user's request (req GPUs, reqbatch) for the policies that honour requests;
* ``start`` gives a held job its shape and releases it; it runs as soon as its GPUs are
  free (at once when they are), reads the last plan written to its job directory, spends
  ``restart_cost`` seconds starting up (no progress) and then trains;
* ``signal_checkpoint``: the job stops training, checkpoints for ``checkpoint_s`` seconds
  and exits with code 75 (FAILED); ``requeue_hold`` puts an ended job back in the queue,
  held, restarts + 1 (a running one is killed and loses what it did since its last
  checkpoint); ``hold`` and ``cancel`` as in Slurm;
* ``read_metrics`` returns the lines a real job writes: a ``start`` event once training
  begins (epochs, dataset size), then ``steps`` lines at most every ``report_s`` seconds
  (measured step time at the current configuration, step count, epoch, batch split,
  samples/s and the gradient noise scale);
* a job that reaches its last epoch exits 0 (COMPLETED) and frees its GPUs.

Ended jobs stay visible for ``min_job_age`` seconds, like Slurm's MinJobAge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcorch.cluster import Observation, ObservedJob, PoolNode, Shape
from hpcorch.errors import HpcorchError
from hpcorch.planner import BatchPlanError, LaunchPlan, plan_batch
from hpcorch.protocol import EXIT_DONE, EXIT_RELAUNCH
from hpcorch.sim.engine import SimCluster, SimJob
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

FIRST_JOB_ID = 1000
JOB_DIR_PREFIX = "sim:"


class SimSlurmError(HpcorchError):
    """An action the simulated Slurm refuses (as scontrol would)."""


def job_tags(spec: WorkloadJob, app: AppTrace, total_gpus: int, job_dir: str) -> dict[str, str]:
    """The hpcorch comment of a managed submission of ``spec`` (bounds as the direct loop)."""
    cap = min(total_gpus, app.max_batch // app.min_micro)
    return {
        "id": spec.name,
        "min": "1",
        "max": str(max(cap, min(spec.num_replicas, total_gpus))),
        "batch": str(app.init_batch),
        "maxbatch": str(app.max_batch),
        "micro": str(app.max_micro),
        "req": str(spec.num_replicas),
        "reqbatch": str(spec.batch_size),
        "app": spec.application,
        "dir": job_dir,
    }


@dataclass
class _Ckpt:
    progress: float = 0.0
    epoch: int = 0
    steps: float = 0.0
    history: int = 0


@dataclass
class SlurmJob:
    """What Slurm knows of one simulated job, around its true model."""

    slurm_id: int
    model: SimJob
    tags: dict[str, str]
    state: str = "PENDING"
    held: bool = True
    shape: Shape | None = None
    nodes: tuple[int, ...] = ()
    restarts: int = 0
    launches: int = 0
    exit_code: int = 0
    start_time: float = 0.0
    end_time: float = 0.0
    first_start: float | None = None
    stop_at: float | None = None
    """When a signalled job exits (it checkpoints until then)."""
    training: bool = False
    """The launch finished starting up and reported its start."""
    plan: LaunchPlan | None = None
    micro: int = 0
    """Per-GPU batch of the running launch (what the job reports)."""
    steps: float = 0.0
    """Optimizer steps taken (what the job's runtime counts)."""
    ckpt: _Ckpt = field(default_factory=_Ckpt)
    lines: list[dict[str, Any]] = field(default_factory=list)
    win_steps: float = 0.0
    win_seconds: float = 0.0
    last_line: float = -1e18

    @property
    def gpus(self) -> int:
        return self.model.gpus

    @property
    def ended(self) -> bool:
        return self.state not in ("PENDING", "RUNNING")


class SimSlurm:
    """A pool of ``node_gpus`` nodes under a simulated Slurm, running ``jobs``."""

    def __init__(
        self,
        jobs: Sequence[WorkloadJob],
        apps: Mapping[str, AppTrace],
        node_gpus: tuple[int, ...],
        restart_cost: float = 30.0,
        checkpoint_s: float = 5.0,
        report_s: float = 60.0,
        min_job_age: float = 300.0,
        user: str = "sim",
    ) -> None:
        self.world = SimCluster(list(jobs), apps, node_gpus, restart_cost)
        self.node_gpus = node_gpus
        self.node_names = tuple(f"sim{i:03d}" for i in range(len(node_gpus)))
        self._index = {n: i for i, n in enumerate(self.node_names)}
        self.restart_cost = restart_cost
        self.checkpoint_s = checkpoint_s
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
            sj = SlurmJob(sid, model, job_tags(model.spec, model.app, total, job_dir))
            self.jobs.append(sj)
            self._by_id[sid] = sj
            self._by_dir[job_dir] = sj
        self._calls = 0

    # --- the Cluster protocol -----------------------------------------------------------
    @property
    def calls(self) -> int:
        return self._calls

    def now(self) -> float:
        return self.world.now

    def observe(self) -> Observation:
        self._calls += 2  # squeue + sinfo
        now = self.world.now
        used = self._used()
        nodes = tuple(
            PoolNode(name, g, used[i], True)
            for i, (name, g) in enumerate(zip(self.node_names, self.node_gpus, strict=True))
        )
        seen = []
        for j in self.jobs:
            if j.model.spec.time > now or (j.ended and now - j.end_time > self.min_job_age):
                continue
            running = j.state == "RUNNING" or j.ended
            seen.append(
                ObservedJob(
                    slurm_id=j.slurm_id,
                    name=j.model.spec.name,
                    user=self.user,
                    state=j.state,
                    held=j.held,
                    reason="JobHeldUser" if j.held else ("" if running else "Resources"),
                    node_names=tuple(self.node_names[i] for i in j.nodes) if running else (),
                    gpus_per_node=j.shape.gpus_per_node if j.shape and running else 0,
                    restarts=j.restarts,
                    exit_code=j.exit_code,
                    submit_time=j.model.spec.time,
                    start_time=j.start_time,
                    tags=j.tags,
                    end_time=j.end_time,
                )
            )
        return Observation(time=now, nodes=nodes, jobs=tuple(seen))

    def start(self, slurm_id: int, shape: Shape) -> None:
        self._calls += 3  # update shape, StartTime, release
        j = self._job(slurm_id)
        if j.state != "PENDING":
            raise SimSlurmError(f"job {slurm_id}: job is not pending ({j.state})")
        if shape.nodes < 1 or shape.gpus_per_node < 1:
            raise SimSlurmError(f"job {slurm_id}: invalid shape {shape}")
        if shape.node_names and any(n not in self._index for n in shape.node_names):
            raise SimSlurmError(f"job {slurm_id}: invalid node name in {shape.node_names}")
        j.shape = shape
        j.held = False
        self._dispatch()

    def hold(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        if j.state != "PENDING":
            raise SimSlurmError(f"job {slurm_id}: job is no longer pending execution")
        j.held = True

    def signal_checkpoint(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        if j.state != "RUNNING":
            raise SimSlurmError(f"job {slurm_id}: job is not running ({j.state})")
        if j.stop_at is None:
            j.stop_at = self.world.now + self.checkpoint_s

    def requeue_hold(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        if j.state == "PENDING":
            j.held = True
            return
        if j.state == "RUNNING":  # killed: back to its last checkpoint
            self._end(j, "CANCELLED", 0, self.world.now)
            self._restore(j)
        j.state, j.held, j.exit_code = "PENDING", True, 0
        j.restarts += 1
        j.nodes = ()

    def cancel(self, slurm_id: int) -> None:
        self._calls += 1
        j = self._job(slurm_id)
        if not j.ended:
            self._end(j, "CANCELLED", 0, self.world.now)
            j.held = False

    def write_plan(self, job_dir: str, plan: LaunchPlan) -> None:
        j = self._by_dir.get(job_dir)
        if j is None:
            raise SimSlurmError(f"no job directory {job_dir}")
        j.plan = plan

    def read_metrics(self, job_dir: str, offset: int) -> tuple[list[dict[str, Any]], int]:
        j = self._by_dir.get(job_dir)
        if j is None:
            return [], offset
        return j.lines[offset:], len(j.lines)

    # --- the simulated world ------------------------------------------------------------
    def all_done(self) -> bool:
        return all(j.state in ("COMPLETED", "CANCELLED") for j in self.jobs)

    def advance(self, seconds: float) -> None:
        """Run the world for ``seconds``: training, checkpoint exits, queued launches."""
        end = self.world.now + seconds
        while True:
            self._dispatch()
            stops = [j.stop_at for j in self.jobs if j.stop_at is not None]
            nxt = min([end, *stops])
            self._run(nxt - self.world.now)
            now = self.world.now = nxt
            for j in self.jobs:
                if j.stop_at is not None and j.stop_at <= now and j.state == "RUNNING":
                    self._checkpoint(j)
                    self._end(j, "FAILED", EXIT_RELAUNCH, now)
            if now >= end:
                break
        self._dispatch()
        self.world.timeline.append((self.world.now, sum(j.gpus for j in self.jobs)))

    def _run(self, dt: float) -> None:
        if dt <= 0:
            return
        now = self.world.now
        self.world.allocated_gpu_seconds += dt * sum(j.gpus for j in self.jobs)
        for j in self.jobs:
            if j.state != "RUNNING":
                continue
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
                self._line(j, now + startup, "start")
            if trained > 0:
                it = self._iteration_time(j)
                j.steps += trained / it
                j.win_steps += trained / it
                j.win_seconds += trained
            if m.completion_time is not None:
                self._report(j, m.completion_time, force=True)
                self._line(j, m.completion_time, "done")
                self._end(j, "COMPLETED", EXIT_DONE, m.completion_time)
            elif j.win_seconds > 0 and now + dt - j.last_line >= self.report_s:
                self._report(j, now + dt)

    # --- launches -----------------------------------------------------------------------
    def _used(self) -> list[int]:
        used = [0] * len(self.node_gpus)
        for j in self.jobs:
            if j.state == "RUNNING" and j.shape is not None:
                for i in j.nodes:
                    used[i] += j.shape.gpus_per_node
        return used

    def _dispatch(self) -> None:
        """Start released pending jobs whose GPUs are free (arrival order, no backfill)."""
        waiting = [
            j
            for j in self.jobs
            if j.state == "PENDING" and not j.held and j.shape is not None and not j.ended
        ]
        if not waiting:
            return
        used = self._used()
        for j in waiting:
            assert j.shape is not None
            free = [g - u for g, u in zip(self.node_gpus, used, strict=True)]
            nodes = self._fit(j.shape, free)
            if nodes is None:
                continue
            for i in nodes:
                used[i] += j.shape.gpus_per_node
            self._launch(j, nodes)

    def _fit(self, shape: Shape, free: list[int]) -> tuple[int, ...] | None:
        per = shape.gpus_per_node
        if shape.node_names:
            idx = tuple(self._index[n] for n in shape.node_names)
            return idx if all(free[i] >= per for i in idx) else None
        fits = sorted((i for i, f in enumerate(free) if f >= per), key=lambda i: (free[i], i))
        return tuple(sorted(fits[: shape.nodes])) if len(fits) >= shape.nodes else None

    def _launch(self, j: SlurmJob, nodes: tuple[int, ...]) -> None:
        assert j.shape is not None
        m = j.model
        now = self.world.now
        gpus = j.shape.gpus
        plan = j.plan
        want = plan.global_batch if plan else int(j.tags["batch"])
        micro_cap = plan.max_micro_batch if plan else m.app.max_micro
        try:
            bp = plan_batch(max(want, gpus), gpus, micro_cap)
        except BatchPlanError:
            bp = plan_batch(gpus, gpus, 1)
        j.state, j.held, j.nodes = "RUNNING", False, nodes
        j.start_time, j.stop_at, j.training = now, None, False
        j.launches += 1
        if j.first_start is None:
            j.first_start = now
        m.placement = tuple((i, j.shape.gpus_per_node) for i in nodes)
        # Below the smallest measured per-GPU batch a step takes as long as at that batch.
        app = m.app
        m.batch, m.accum_steps, j.micro = bp.global_batch, bp.accum_steps, bp.micro_batch
        m.micro_batch = min(max(bp.micro_batch, app.min_micro), app.max_micro)
        m.rescale_left = self.restart_cost
        m.restarts += 1
        if m.start_time is None:
            m.start_time = now
        j.win_steps = j.win_seconds = 0.0
        j.last_line = -1e18

    def _end(self, j: SlurmJob, state: str, code: int, at: float) -> None:
        j.state, j.exit_code, j.end_time, j.stop_at = state, code, at, None
        j.model.placement = ()
        j.training = False

    # --- checkpoints --------------------------------------------------------------------
    def _checkpoint(self, j: SlurmJob) -> None:
        m = j.model
        j.ckpt = _Ckpt(m.progress, m.epoch, j.steps, len(m.grad_history))

    def _restore(self, j: SlurmJob) -> None:
        m, c = j.model, j.ckpt
        m.progress, m.epoch, j.steps = c.progress, c.epoch, c.steps
        del m.grad_history[c.history :]

    # --- what the job reports -----------------------------------------------------------
    def _iteration_time(self, j: SlurmJob) -> float:
        """Seconds per optimizer step of the running launch (the true model's)."""
        return j.model.iteration_time()[0]

    def _line(self, j: SlurmJob, at: float, event: str) -> None:
        m = j.model
        line: dict[str, Any] = {"time": at, "event": event, "step": int(j.steps)}
        if event == "start":
            app = m.app
            line["epochs"] = app.epochs
            line["dataset_size"] = max(1, round(app.progress_per_epoch_hint * app.init_batch))
            line["epoch"] = m.epoch
            line["model"] = app.name  # what the runtime reports of its model
            line["params"] = app.model_bytes // 4
            line["model_bytes"] = app.model_bytes
        j.lines.append(line)

    def _report(self, j: SlurmJob, at: float, force: bool = False) -> None:
        if j.win_steps <= 0 and not force:
            return
        m = j.model
        it = self._iteration_time(j)
        noise = None
        if m.grad is not None and m.grad[0] > 0:
            noise = m.grad[1] / m.grad[0] * m.app.init_batch
        j.lines.append(
            {
                "time": at,
                "event": "steps",
                "step": int(j.steps),
                "steps": round(j.win_steps),
                "step_time": it,
                "samples_per_s": m.batch / it,
                "loss": None,
                "epoch": m.epoch,
                "global_batch": m.batch,
                "per_gpu_batch": j.micro,
                "accum_steps": m.accum_steps,
                "gpus": m.gpus,
                "noise_scale": noise,
            }
        )
        j.win_steps = j.win_seconds = 0.0
        j.last_line = at

    def _job(self, slurm_id: int) -> SlurmJob:
        j = self._by_id.get(slurm_id)
        if j is None or j.model.spec.time > self.world.now:
            raise SimSlurmError(f"invalid job id {slurm_id}")
        return j
