"""A featherweight emulated training job: the job protocol of hpcorch's runtime, no torch.

Light enough that several hundred run at once on a small machine (benchmarks/site_scale.py):
it starts in a few hundredths of a second of CPU and sleeps between the moments the
protocol needs it. From the controller's side it is the runtime and
benchmarks/emulated_job.py:

* the plan: the launch's batch from ``$HPCORCH_PLAN`` (bounds, per-GPU batch and
  accumulation planned as the runtime plans them), its placement from the job wrapper;
* the start report (the application's epochs, model and size, as emulated_job.py reports
  them), the heartbeat, ``first_step``;
* steps at the application's measured speed for its placement, per-GPU batch and
  accumulation (hpcorch/sim/traces.py's model, asked of the benchmark's ``AppTrace`` over
  a socket, ``--step-times``, else benchmarks/light_profile.py's), each advancing its
  statistical progress by the profile's gain; one ``steps`` line per metrics interval,
  with the runtime's fields;
* the checkpoint signal: the step under way ends, a checkpoint is written (atomically,
  fsynced), then ``exit 75`` as the runtime says it (heartbeat, exit code);
* exact progress on resume, from the newest checkpoint that loads;
* live batch changes: a rewritten plan of this launch is taken from the next step;
* the end (final checkpoint, ``done``, exit 0); the launch fence
  (hpcorch/runtime/fence.py) and the exit codes 74 (job directory) and 78 (plan).

It does not exercise DDP, torch or the runtime's own code paths (process group, sampler,
data loader, checkpoint format, the ranks' agreement at step boundaries), nor GPU types.
Only rank 0 lives: the other ranks exit at once, so a launch of N GPUs costs one Python
process. It steps virtually: it wakes at most once a second (and for each metrics line,
the end, a signal) and counts the steps that passed, so a 20 ms step costs nothing; a
rewritten plan is noticed within a second (the runtime: at the next step).
benchmarks/emulated_job.py is the faithful one: every step on the real runtime, over gloo.

    hpcorch submit --min-gpus 1 --max-gpus 8 --app cifar10 ... \\
        benchmarks/light_job.py --profile DIR/cifar10.json [--step-times SOCKET]
"""

# ruff: noqa: E402  (the other ranks leave before anything is imported)
from __future__ import annotations

import os
import sys

if os.environ.get("RANK", "0") != "0":  # only rank 0 lives (see above): before any import
    sys.exit(0)

# isort: split
import signal


def _signals(spec: str) -> set[int]:
    """The checkpoint signals (``$HPCORCH_CKPT_SIGNAL``: USR2, SIGUSR2,TERM or 12); empty
    when one is unknown (said once the logger exists)."""
    out: set[int] = set()
    for raw in spec.split(","):
        name = raw.strip().upper()
        if name.isdigit():
            out.add(int(name))
        elif name:
            sig = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
            if not isinstance(sig, signal.Signals):
                return set()
            out.add(int(sig))
    return out


# blocked from the first moment (their default action would end the process); taken by
# sigtimedwait below, so none is ever lost
SIGNALS = _signals(os.environ.get("HPCORCH_CKPT_SIGNAL") or "USR2")
signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS or {signal.SIGUSR2})

# isort: split
import argparse
import importlib.util
import json
import time
import types
from pathlib import Path

from hpcorch import logsetup
from hpcorch.planner import (
    BatchPlan,
    BatchPlanError,
    LaunchPlan,
    PlanFileError,
    PlanWatcher,
    batch_from_plan,
    clamp_global_batch,
    plan_batch,
    read_plan,
)
from hpcorch.protocol import (
    CHECKPOINT_DIR,
    CHECKPOINT_PREFIX,
    ENV_CKPT_INTERVAL,
    ENV_CKPT_SIGNAL,
    ENV_CPUS_PER_GPU,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_LAUNCH,
    ENV_MAX_GLOBAL_BATCH,
    ENV_METRICS_INTERVAL,
    ENV_MIN_GLOBAL_BATCH,
    ENV_PLAN,
    ENV_QUIET_RELAUNCH,
    EXIT_CONFIG,
    EXIT_DONE,
    EXIT_RELAUNCH,
    HEARTBEAT_FILE,
    METRICS_FILE,
    TMP_SUFFIX,
)


def _runtime_module(name: str) -> types.ModuleType:
    """hpcorch/runtime/NAME.py without the package's __init__ (which imports torch): the
    runtime's own fence and metrics writers, which need only the standard library."""
    pkg = "hpcorch.runtime"
    if pkg not in sys.modules:
        import hpcorch

        stub = types.ModuleType(pkg)
        stub.__path__ = [str(Path(hpcorch.__file__).parent / "runtime")]
        sys.modules[pkg] = stub
    full = f"{pkg}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    spec = importlib.util.spec_from_file_location(
        full, Path(sys.modules[pkg].__path__[0]) / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


fence_mod = _runtime_module("fence")
metrics_mod = _runtime_module("metrics")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from light_profile import Profile, StepTimes, placement

CKPT_SUFFIX = ".json"
WAKE_S = 1.0
"""Longest sleep between two looks at the plan file and the fence."""
log = logsetup.ensure("hpcorch")


class Stop(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _int_env(name: str) -> int | None:
    raw = os.environ.get(name, "")
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
        log.error("%s=%r must be a positive integer", name, raw)
        raise Stop(EXIT_CONFIG)
    return int(raw)


def _float_env(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        log.error("%s=%r is not a number", name, os.environ.get(name))
        raise Stop(EXIT_CONFIG) from None
    return max(0.0, value)


class LightJob:
    """One launch of the emulated job (rank 0)."""

    def __init__(self, profile: Profile, step_times: StepTimes) -> None:
        self.p = profile
        self.step_times = step_times
        self.job_dir = Path(os.environ.get(ENV_JOB_DIR) or "hpcorch-job").absolute()
        self.job_id = os.environ.get(ENV_JOB_ID) or None
        launch = os.environ.get(ENV_LAUNCH, "")
        self.launch = int(launch) if launch.isascii() and launch.isdigit() else None
        self.world = int(os.environ.get("WORLD_SIZE") or 1)
        self.counts = placement()
        fence = fence_mod.Fence(self.job_dir, os.environ.get("SLURM_JOB_ID") or None, self.launch)
        self.gate = fence_mod.Gate(fence)
        interval = _float_env(ENV_METRICS_INTERVAL, 5.0)
        self.metrics = metrics_mod.MetricsWriter(
            self.job_dir / METRICS_FILE, interval, gate=self.gate, launch=self.launch
        )
        self.heartbeat = metrics_mod.Heartbeat(
            self.job_dir / HEARTBEAT_FILE, gate=self.gate, launch=self.launch
        )
        self.ckpt_interval = _float_env(ENV_CKPT_INTERVAL, 0.0)
        self.lower = _int_env(ENV_MIN_GLOBAL_BATCH)
        self.upper = _int_env(ENV_MAX_GLOBAL_BATCH)
        plan_path = os.environ.get(ENV_PLAN) or ""
        plan: LaunchPlan | None = None
        if plan_path:
            try:
                plan = read_plan(plan_path)
            except PlanFileError as exc:
                log.error("%s", exc)
                raise Stop(EXIT_CONFIG) from None
            if self.job_id and plan.job and plan.job != self.job_id:
                log.error("plan %s is for job %r, not for %r", plan_path, plan.job, self.job_id)
                raise Stop(EXIT_CONFIG)
        self.plan_launch = plan.launch if plan else None
        requested = plan.global_batch if plan else profile.init_batch
        self.requested = requested
        micro = plan.max_micro_batch if plan else profile.max_micro
        try:
            bounded = clamp_global_batch(requested, self.lower, self.upper)
            self.batch = plan_batch(bounded, self.world, micro)
        except BatchPlanError as exc:
            log.error("cannot plan the batch: %s", exc)
            raise Stop(EXIT_CONFIG) from None
        self.watch = PlanWatcher(Path(plan_path) if plan_path else None)
        self.watch.changed()  # the plan as read: a change is what comes after
        self.dataset = max(1, round(profile.progress_per_epoch_hint * profile.init_batch))
        # the position, as the runtime's and the emulated job's statistical one
        self.step = 0
        self.data_epoch = 0
        self.offset = 0
        self.progress = 0.0
        self.epoch = 0
        self.resumed = ""
        self.pending: BatchPlan | None = None
        self.signalled: float | None = None
        """When the checkpoint signal came (wall clock, as the runtime reports it)."""
        self.signal_at: float | None = None
        self.gains: dict[tuple[int, int], float] = {}
        self.window = (0, 0, 0.0)  # steps, samples, seconds since the last steps line
        self.checkpoint_dir = self.job_dir / CHECKPOINT_DIR

    # -- checkpoints ------------------------------------------------------------------------
    def _checkpoints(self) -> list[tuple[int, Path]]:
        if not self.checkpoint_dir.is_dir():
            return []
        found = []
        for p in self.checkpoint_dir.iterdir():
            stem = p.name[len(CHECKPOINT_PREFIX) : -len(CKPT_SUFFIX)]
            ours = p.name.startswith(CHECKPOINT_PREFIX) and p.name.endswith(CKPT_SUFFIX)
            if ours and stem.isdigit():
                found.append((int(stem), p))
        return sorted(found)

    def restore(self) -> None:
        """From the newest checkpoint that loads (a damaged one is skipped)."""
        for _, path in reversed(self._checkpoints()):
            try:
                doc = json.loads(path.read_text())
                if self.job_id and doc.get("job") not in (None, self.job_id):
                    log.error("checkpoint %s belongs to job %r", path, doc.get("job"))
                    raise Stop(EXIT_CONFIG)
                self.step, self.data_epoch = int(doc["global_step"]), int(doc["epoch"])
                self.offset = int(doc["offset"])
                self.progress, self.epoch = float(doc["progress"]), int(doc["stat_epoch"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.info("checkpoint %s does not load (%s): skipped", path.name, exc)
                continue
            self.resumed = path.name
            log.info("resuming from %s", path)
            return

    def checkpoint(self, reason: str) -> None:
        t0 = time.perf_counter()
        path = self.checkpoint_dir / f"{CHECKPOINT_PREFIX}{self.step:09d}{CKPT_SUFFIX}"
        body = {
            "job": self.job_id, "global_step": self.step, "epoch": self.data_epoch,
            "offset": self.offset, "progress": self.progress, "stat_epoch": self.epoch,
            "global_batch": self.batch.global_batch, "written_at": time.time(),
        }  # fmt: skip
        data = json.dumps(body).encode()

        def write() -> None:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + TMP_SUFFIX)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(self.checkpoint_dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            for _, old in self._checkpoints()[:-2]:  # keep two, as the runtime
                old.unlink(missing_ok=True)

        self.gate.write(path, write)
        self._stop_on_failure()
        self.last_ckpt = time.monotonic()
        self.metrics.event(
            "checkpoint", reason=reason, step=self.step, path=str(path), bytes=len(data),
            seconds=time.perf_counter() - t0, signal_time=self.signalled,
            written_time=time.time(),
        )  # fmt: skip

    def _stop_on_failure(self) -> None:
        if self.gate.failure is not None:
            code, msg = self.gate.failure
            log.error("%s", msg)
            raise Stop(code)

    # -- the loop -----------------------------------------------------------------------------
    def seconds_per_step(self) -> float:
        return max(1e-4, self.step_times(self.counts, self.batch))

    def gain(self, epoch: int) -> float:
        """Statistical progress of one step at this batch in ``epoch``."""
        key = (self.batch.global_batch, epoch)
        hit = self.gains.get(key)
        if hit is None:
            hit = self.gains[key] = self.p.gain(self.batch.global_batch, epoch)
        return hit

    def advance(self) -> bool:
        """One optimizer step; True when training is done."""
        size = self.batch.global_batch
        self.progress += self.gain(self.epoch)
        self.step += 1
        self.offset += size
        if self.offset >= self.dataset:
            self.data_epoch, self.offset = self.data_epoch + 1, 0
        if self.progress >= self.p.epoch_end[self.epoch + 1]:
            self.epoch += 1
        steps, samples, seconds = self.window
        self.window = (steps + 1, samples + size, seconds + self.t_step)
        return self.epoch >= self.p.epochs

    def steps_line(self) -> None:
        steps, samples, seconds = self.window
        if not steps:
            return
        b = self.batch
        self.metrics.event(
            "steps", step=self.step, steps=steps, step_time=seconds / steps,
            samples_per_s=samples / seconds if seconds > 0 else None, loss=None,
            data_wait=0.0, epoch=self.epoch, global_batch=b.global_batch,
            per_gpu_batch=b.micro_batch, accum_steps=b.accum_steps, gpus=self.world,
            cpus_per_gpu=int(os.environ.get(ENV_CPUS_PER_GPU) or 1), lr_factor=1.0,
            noise_scale=self._noise(), progress=float(self.step),
            max_memory_allocated=None, max_memory_reserved=None,
        )  # fmt: skip
        self.window = (0, 0, 0.0)
        self.last_line = time.monotonic()

    def _noise(self) -> float | None:
        sqr, var = self.p.grad_stats(self.batch.global_batch, self.epoch)
        return var / sqr * self.p.init_batch if sqr > 0 else None

    def start(self) -> None:
        self.gate.write(self.job_dir, lambda: self.job_dir.mkdir(parents=True, exist_ok=True))
        self.restore()
        self.heartbeat.beat(self.step, state="starting", force=True)
        self._stop_on_failure()
        b = self.batch
        self.metrics.event(
            "start", dataset_size=self.dataset, epochs=self.p.epochs, model=self.p.name,
            params=self.p.model_bytes // 4, model_bytes=self.p.model_bytes, step=self.step,
            epoch=self.epoch, offset=self.offset, resumed=bool(self.resumed),
            launcher="light", backend="none", master="", gpus=self.world,
            global_batch=b.global_batch, requested_batch=self.requested,
            per_gpu_batch=b.micro_batch, accum_steps=b.accum_steps, lr_scaling="none",
            pid=os.getpid(), since_start_at_init=round(metrics_mod.process_age(), 3),
        )  # fmt: skip

    def rebatch(self) -> None:
        """A rewritten plan of this launch: its batch from the next step."""
        plan = self.watch.changed()
        if plan is None:
            return
        new = batch_from_plan(
            plan, world_size=self.world, job_id=self.job_id, launch=self.plan_launch,
            lower=self.lower, upper=self.upper,
        )  # fmt: skip
        if new is not None and new != self.batch:
            self.pending = new

    def apply_pending(self) -> None:
        new, self.pending = self.pending, None
        if new is None or new == self.batch:
            return
        self.steps_line()  # the old batch's steps in a line of their own
        old = self.batch
        self.batch = new
        self.t_step = self.seconds_per_step()
        self.metrics.event(
            "rebatch", step=self.step, from_batch=old.global_batch,
            global_batch=new.global_batch, per_gpu_batch=new.micro_batch,
            accum_steps=new.accum_steps,
        )  # fmt: skip
        log.info("global batch %s -> %s from step %d", old.describe(), new.describe(), self.step)

    def finish_before(self, wake: float) -> float | None:
        """When the step that ends training ends, if before ``wake`` (at this batch)."""
        progress, epoch, at = self.progress, self.epoch, self.next_step
        ends, last = self.p.epoch_end, self.p.epochs
        while at <= wake:
            progress += self.gain(epoch)
            if progress >= ends[epoch + 1]:
                epoch += 1
                if epoch >= last:
                    return at
            at += self.t_step
        return None

    def run(self) -> int:
        self.start()
        if self.epoch >= self.p.epochs:  # resumed from its final checkpoint
            return self.finish()
        self.t_step = self.seconds_per_step()
        now = time.monotonic()
        self.next_step = now + self.t_step  # the end of the step under way
        self.last_line = self.last_ckpt = fence_at = now
        first = True
        interval = self.metrics.interval
        while True:
            now = time.monotonic()
            while self.next_step <= now:  # the steps that ended since the last look
                end = self.next_step
                done = self.advance()
                if first:
                    first = False
                    age = metrics_mod.process_age()
                    self.metrics.event("first_step", step=self.step, since_start=age)
                if done:
                    return self.finish()
                if self.signal_at is not None and end >= self.signal_at:
                    self.steps_line()  # the step under way when the signal came has ended
                    self.checkpoint("signal")
                    return self.exit_relaunch()
                if self.pending is not None:
                    self.apply_pending()
                if end - self.last_line >= interval:
                    self.steps_line()
                    self.heartbeat.beat(self.step)
                self.next_step = end + self.t_step
            self._stop_on_failure()
            if now - fence_at >= 1.0:  # a newer launch took over: stop before writing more
                fence_at = now
                self.gate.check()
                self._stop_on_failure()
            if self.ckpt_interval and now - self.last_ckpt >= self.ckpt_interval:
                self.checkpoint("periodic")
            self.rebatch()
            wake = min(now + WAKE_S, max(self.next_step, self.last_line + interval))
            if self.signal_at is not None or first:
                wake = self.next_step
            wake = self.finish_before(wake) or wake
            got = signal.sigtimedwait(SIGNALS, max(0.0, wake - time.monotonic()))
            if got is not None and self.signal_at is None:
                self.signal_at, self.signalled = time.monotonic(), time.time()

    def exit_relaunch(self) -> int:
        self.metrics.event("exit", code=EXIT_RELAUNCH, step=self.step)
        said = self.heartbeat.beat(self.step, state=f"exit {EXIT_RELAUNCH}", force=True)
        if said and os.environ.get(ENV_QUIET_RELAUNCH) == "1":
            return EXIT_DONE  # the wrapper reads the relaunch from the heartbeat
        return EXIT_RELAUNCH

    def finish(self) -> int:
        self.steps_line()
        self.checkpoint("done")
        self.metrics.event("done", step=self.step)
        self.heartbeat.beat(self.step, state="done", force=True)
        self._stop_on_failure()
        return EXIT_DONE


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", required=True, help="the application's profile (JSON)")
    p.add_argument("--step-times", default="", help="the benchmark's step-time socket")
    p.add_argument("--time-scale", type=float, default=1.0, help="the profile's time scale")
    args = p.parse_args()
    if not SIGNALS:
        log.error("%s names an unknown signal", ENV_CKPT_SIGNAL)
        return EXIT_CONFIG
    try:
        profile = Profile.load(args.profile)
    except (OSError, ValueError, KeyError) as exc:
        log.error("cannot read the profile %s: %s", args.profile, exc)
        return EXIT_CONFIG
    try:
        job = LightJob(profile, StepTimes(profile, args.step_times, args.time_scale))
        if signal.sigpending() & SIGNALS:  # before the job existed: at its first step
            job.signal_at, job.signalled = time.monotonic(), time.time()
            signal.sigtimedwait(SIGNALS, 0)
        return job.run()
    except Stop as stop:
        return stop.code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # nothing left to tear down
