"""What a job reports (its metrics lines), taken into its record. Pure but for ``log``.

Every value is checked (hpcorch/controller/validate.py): a line with a bad required value
is dropped, an optional bad value is ignored. A job's script writes these lines, so
nothing here may raise on anything a line holds.

What Slurm knows outranks what a job says: a throughput sample is stored at the shape Slurm
shows the running launch (the record's ``gpus`` and ``nodes``, which
:func:`hpcorch.controller.reconcile.observe` sets from Slurm), never at the ``gpus`` a line
names. A steps line that names another GPU count is dropped whole (no sample, no field of
the record taken from it), and said once per launch of the job; so is a line read before
Slurm shows where the launch runs. A line of an earlier launch (its ``launch``, the
wrapper's ``SLURM_RESTART_COUNT``, below Slurm's restart count), read late, is dropped
quietly: it was measured at a shape Slurm no longer shows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from hpcorch.controller.identity import fingerprint, model_bytes
from hpcorch.controller.store import JobRecord, Sample
from hpcorch.controller.validate import MAX_COUNT, as_float, as_int, printable, steps_line
from hpcorch.protocol import MAX_DECLARED_EPOCHS


def digest(rec: JobRecord, line: Mapping[str, Any], log: Callable[[str], None]) -> Sample | None:
    """Take one metrics line into ``rec``; the throughput sample it carries, if any."""
    event = line.get("event")
    if event in ("launch", "mode", "checkpoint", "resumed", "stop"):
        _sidecar_event(rec, str(event), line, log)
        return None
    if event == "start":
        rec.ready = 1
        # failed starts count from 0 again only once a launch keeps something: a checkpoint
        _restarted_from(rec, as_int(line.get("step"), 0, MAX_COUNT) or 0, log)
        # when it started training (the job's own clock; reconcile.trained_since bounds it)
        rec.ready_at = as_float(line.get("time"), 0.0, 1e11) or rec.phase_since
        epochs = as_int(line.get("epochs"), 1, MAX_DECLARED_EPOCHS)
        size = as_int(line.get("dataset_size"), 1, MAX_COUNT)
        if epochs:
            rec.epochs = epochs
        if size:
            rec.steps_per_epoch = size / max(1, rec.batch)
        # what identifies its model (pooling key) and sizes its all-reduce (a prior)
        rec.fingerprint = fingerprint(line.get("model"), line.get("params"), size)
        rec.model_bytes = model_bytes(line.get("model_bytes"))
        return None
    if event != "steps":
        return None
    s = steps_line(line)
    if s is None or not _slurm_shape(rec, line, s.gpus, log):
        return None
    gpus = rec.gpus
    batch = s.global_batch or rec.global_batch or rec.batch
    if s.epoch is not None:
        rec.epoch = s.epoch
    if s.total_steps and rec.mode == "sidecar":
        rec.epochs = rec.epochs or 1
        rec.steps_per_epoch = s.total_steps * batch / max(1, rec.batch) / rec.epochs
    rec.global_batch = batch
    rec.cpus_per_gpu = s.cpus_per_gpu or rec.cpus_per_gpu
    rec.micro_batch = s.micro_batch
    rec.accum_steps = s.accum_steps
    rec.samples_per_s = s.samples_per_s
    rec.progress = max(rec.progress, s.step * batch / max(1, rec.batch))
    rec.trained_step = max(rec.trained_step, min(s.step, MAX_COUNT))
    return Sample(
        slurm_id=rec.slurm_id,
        time=s.time,
        gpus=gpus,
        nodes=max(1, rec.nodes),  # Slurm's, as the GPUs
        micro_batch=rec.micro_batch,
        accum_steps=rec.accum_steps,
        global_batch=batch,
        step_time=s.step_time,
        samples_per_s=rec.samples_per_s,
        loss=s.loss,
        noise_scale=s.noise_scale,
        step=s.step,
        cpus_per_gpu=rec.cpus_per_gpu,
        data_wait=s.data_wait,
        epoch=rec.epoch,
        gpu_type=rec.gpu_type,
    )


def _restarted_from(rec: JobRecord, step: int, log: Callable[[str], None]) -> None:
    """A launch that starts from step 0 after earlier launches trained lost their work (no
    checkpoint was written, or none was found): said in the log and the job's reason, and
    counted in its lost steps."""
    if step == 0 and rec.trained_step > 0:
        lost = rec.trained_step
        rec.lost_steps = min(rec.lost_steps + lost, MAX_COUNT)
        rec.reason = (
            f"launch {rec.launches} started from step 0: the {lost} steps earlier launches "
            "trained are lost (no checkpoint was written or found)"
        )
        log(f"job {rec.slurm_id} {rec.reason}")
    rec.trained_step = step


MAX_SAID = 4096
"""Launches whose shape mismatch was said, remembered (the oldest forgotten first)."""
_said: OrderedDict[tuple[int, float, int], None] = OrderedDict()


def _slurm_shape(
    rec: JobRecord, line: Mapping[str, Any], gpus: int | None, log: Callable[[str], None]
) -> bool:
    """Whether a steps line may be counted at the shape Slurm shows for ``rec``."""
    launch = as_int(line.get("launch"), 0, MAX_COUNT)
    if launch is not None and launch < rec.slurm_restarts:
        return False  # an earlier launch's line, read late
    if rec.gpus <= 0:
        return False  # Slurm has not shown where this launch runs
    if gpus is None or gpus == rec.gpus:
        return True
    said = (rec.slurm_id, rec.submit_time, rec.launches)
    if said not in _said:
        _said[said] = None
        if len(_said) > MAX_SAID:
            _said.popitem(last=False)
        log(
            f"job {rec.slurm_id} reported steps on {gpus} GPUs; Slurm runs launch "
            f"{rec.launches} on {rec.gpus} GPU(s), {max(1, rec.nodes)} node(s): lines of "
            "another shape are dropped"
        )
    return False


def _flag(line: Mapping[str, Any], key: str, default: int) -> int:
    value = line.get(key)
    return int(value) if isinstance(value, bool) else default


def _sidecar_event(
    rec: JobRecord, event: str, line: Mapping[str, Any], log: Callable[[str], None]
) -> None:
    """What the sidecar (or the runtime) says about stopping and resuming the job."""
    if event == "launch":
        if rec.mode_detected:
            return  # it uses the runtime: ready once the runtime reports its start
        rec.ready = 1  # the sidecar holds the signal: it can be stopped from now on
        rec.mode = "sidecar"
        rec.resumable = _flag(line, "resumable", rec.resumable)
        rec.predictable = _flag(line, "predictable", rec.predictable)
        rec.needs_ckpt = _flag(line, "watches_checkpoints", rec.needs_ckpt)
    elif event == "mode" and line.get("mode") == "managed":
        if rec.mode != "managed" or not rec.mode_detected:
            log(f"job {rec.slurm_id} uses hpcorch's runtime: managed mode")
        rec.mode, rec.mode_detected = "managed", 1
        rec.resumable = rec.predictable = 1
    elif event == "checkpoint":
        rec.checkpoints = min(rec.checkpoints + 1, MAX_COUNT)
        # something kept: failed starts and launches without a checkpoint count from 0
        rec.start_failures = rec.checkpoint_misses = 0
    elif event == "resumed":
        lost = as_int(line.get("lost_steps"), 1, MAX_COUNT)
        if lost:
            rec.lost_steps = min(rec.lost_steps + lost, MAX_COUNT)
            step = as_int(line.get("step"), 0, MAX_COUNT)
            log(f"job {rec.slurm_id} resumed at step {step}: {lost} steps lost")
    elif event == "stop" and line.get("graceful") is False:
        rec.kills += 1
        waited = line.get("waited_s")
        shown = printable(str(waited), 16) if isinstance(waited, int | float) else "?"
        log(f"job {rec.slurm_id} ignored its stop signal and was killed after {shown} s")
