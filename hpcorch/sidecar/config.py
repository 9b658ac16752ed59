"""The sidecar's decisions, apart from its processes: configuration from the environment,
progress parsed from a script's output, the relaunch command and checkpoint bookkeeping.

Pure except for :func:`latest_checkpoint`, which lists one directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.protocol import (
    DEFAULT_STOP_GRACE_S,
    DEFAULT_STOP_SIGNAL,
    ENV_CKPT_SIGNAL,
    ENV_JOB_DIR,
    ENV_METRICS_INTERVAL,
    ENV_PROGRESS_FILE,
    ENV_PROGRESS_REGEX,
    ENV_RESUME_ARGS,
    ENV_RESUME_CMD,
    ENV_SCRIPT_CKPT_DIR,
    ENV_STOP_COMMAND,
    ENV_STOP_GRACE,
    ENV_STOP_SIGNAL,
)

TEMP_NAME = re.compile(r"(^\.|\.(tmp|temp|part|partial|lock)$|~$)", re.IGNORECASE)
"""Files in a checkpoint directory that are not (yet) checkpoints."""
PROGRESS_GROUPS = ("step", "total", "epoch", "loss")


class SidecarError(ValueError):
    """The sidecar's configuration cannot be used."""


def signal_number(name: str) -> int:
    """``TERM``, ``SIGTERM`` or ``15`` -> 15; SidecarError for anything else."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    text = text if text.startswith("SIG") else "SIG" + text
    try:
        return int(signal.Signals[text])
    except KeyError:
        raise SidecarError(f"unknown signal '{name}'") from None


def check_regex(pattern: str) -> re.Pattern[str]:
    """A progress regex: its named groups step/total/epoch/loss, or groups 1 and 2 (step,
    total)."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise SidecarError(f"progress regex {pattern!r} does not compile: {exc}") from None
    if "step" not in rx.groupindex and rx.groups < 1:
        raise SidecarError(
            f"progress regex {pattern!r} captures nothing: use a group for the step, e.g. "
            r"'step (\d+)/(\d+)' or '(?P<step>\d+)'"
        )
    return rx


@dataclass(frozen=True)
class SidecarConfig:
    job_dir: Path
    stop_signal: str = DEFAULT_STOP_SIGNAL
    stop_command: str | None = None
    grace_s: float = float(DEFAULT_STOP_GRACE_S)
    ckpt_dir: Path | None = None
    resume_args: tuple[str, ...] = ()
    resume_cmd: tuple[str, ...] = ()
    progress_regex: re.Pattern[str] | None = None
    progress_file: Path | None = None
    ckpt_signals: tuple[str, ...] = ("USR2",)
    """Signals that ask the job to stop for a relaunch (the controller's)."""
    metrics_interval_s: float = 5.0
    controlled: bool = False

    @property
    def resumable(self) -> bool:
        """Whether the script keeps a checkpoint it can be restarted from."""
        return bool(self.ckpt_dir or self.resume_args or self.resume_cmd)

    @property
    def predictable(self) -> bool:
        return self.progress_regex is not None or self.progress_file is not None


def _json_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    text = env.get(name, "")
    if not text:
        return ()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SidecarError(f"{name} must be a JSON list of strings, got {text!r}")
    return tuple(value)


def config_from_env(env: Mapping[str, str], cwd: Path) -> SidecarConfig:
    job_dir = env.get(ENV_JOB_DIR)
    if not job_dir:
        raise SidecarError(f"{ENV_JOB_DIR} is not set")
    stop = env.get(ENV_STOP_SIGNAL) or DEFAULT_STOP_SIGNAL
    signal_number(stop)
    grace_text = env.get(ENV_STOP_GRACE) or str(DEFAULT_STOP_GRACE_S)
    try:
        grace = float(grace_text)
    except ValueError:
        grace = -1.0
    if not grace >= 0:
        raise SidecarError(f"{ENV_STOP_GRACE} must be a number of seconds, got {grace_text!r}")
    ckpt_signals = tuple(
        s.strip().upper().removeprefix("SIG")
        for s in (env.get(ENV_CKPT_SIGNAL) or "USR2").split(",")
        if s.strip()
    )
    for s in ckpt_signals:
        signal_number(s)
    regex = env.get(ENV_PROGRESS_REGEX)
    ckpt_dir = env.get(ENV_SCRIPT_CKPT_DIR)
    progress_file = env.get(ENV_PROGRESS_FILE)
    try:
        interval = float(env.get(ENV_METRICS_INTERVAL) or 5.0)
    except ValueError:
        interval = 5.0
    cfg = SidecarConfig(
        job_dir=Path(job_dir),
        stop_signal=stop.strip().upper().removeprefix("SIG"),
        stop_command=env.get(ENV_STOP_COMMAND) or None,
        grace_s=grace,
        ckpt_dir=(cwd / ckpt_dir) if ckpt_dir else None,
        resume_args=_json_list(env, ENV_RESUME_ARGS),
        resume_cmd=_json_list(env, ENV_RESUME_CMD),
        progress_regex=check_regex(regex) if regex else None,
        progress_file=(cwd / progress_file) if progress_file else None,
        ckpt_signals=ckpt_signals or ("USR2",),
        metrics_interval_s=max(0.2, interval),
        controlled=bool(env.get("HPCORCH_CONTROLLED")),
    )
    uses_ckpt = any("{ckpt}" in a for a in (*cfg.resume_args, *cfg.resume_cmd))
    if uses_ckpt and cfg.ckpt_dir is None:
        raise SidecarError("the resume arguments name {ckpt} but no checkpoint directory is set")
    return cfg


# --- checkpoints --------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    path: Path
    mtime: float


def latest_checkpoint(directory: Path | None) -> Checkpoint | None:
    """The newest finished file (or directory) in ``directory``; temporary names skipped."""
    if directory is None:
        return None
    best: Checkpoint | None = None
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    for entry in entries:
        if TEMP_NAME.search(entry.name):
            continue
        try:
            mtime = entry.stat().st_mtime
        except OSError:
            continue
        if best is None or (mtime, entry.name) > (best.mtime, best.path.name):
            best = Checkpoint(Path(entry.path), mtime)
    return best


def _substitute(args: Sequence[str], ckpt: Checkpoint | None, ckpt_dir: Path | None) -> list[str]:
    values = {"{ckpt}": str(ckpt.path) if ckpt else "", "{ckpt_dir}": str(ckpt_dir or "")}
    out = []
    for a in args:
        for key, value in values.items():
            a = a.replace(key, value)
        out.append(a)
    return out


def launch_command(
    cmd: Sequence[str], cfg: SidecarConfig, ckpt: Checkpoint | None, launch: int, python: str
) -> tuple[list[str], bool]:
    """The command of this launch and whether it resumes: the script's own on a first
    launch (or with nothing to resume from), else the resume command or the script's with
    the resume arguments appended."""
    resume = ckpt is not None if cfg.ckpt_dir is not None else launch > 0
    if not resume or not (cfg.resume_args or cfg.resume_cmd):
        return list(cmd), resume
    if cfg.resume_cmd:
        new = _substitute(cfg.resume_cmd, ckpt, cfg.ckpt_dir)
        return ([python, *new] if new[0].endswith(".py") else new), True
    return [*cmd, *_substitute(cfg.resume_args, ckpt, cfg.ckpt_dir)], True


# --- progress -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Progress:
    step: int
    total: int | None = None
    epoch: int | None = None
    loss: float | None = None


def _num(value: Any, kind: type[int] | type[float]) -> Any:
    try:
        return kind(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


def parse_output_line(rx: re.Pattern[str], line: str) -> Progress | None:
    m = rx.search(line)
    if m is None:
        return None
    named = m.groupdict()
    if "step" in rx.groupindex:
        step, total = named.get("step"), named.get("total")
    else:
        step = m.group(1)
        total = m.group(2) if rx.groups >= 2 else None
    step_n = _num(step, int)
    if step_n is None:
        return None
    return Progress(
        step=step_n,
        total=_num(total, int),
        epoch=_num(named.get("epoch"), int),
        loss=_num(named.get("loss"), float),
    )


def parse_json_line(line: str) -> Progress | None:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    step = _num(doc.get("step"), int)
    if step is None:
        return None
    return Progress(
        step=step,
        total=_num(doc.get("total"), int),
        epoch=_num(doc.get("epoch"), int),
        loss=_num(doc.get("loss"), float),
    )


@dataclass
class ProgressTracker:
    """Steps seen over time in one launch, turned into the controller's ``steps`` lines."""

    gpus: int
    global_batch: int
    per_gpu_batch: int
    interval_s: float = 5.0
    cpus_per_gpu: int = 0
    points: list[tuple[float, int]] = field(default_factory=list)
    total: int | None = None
    epoch: int | None = None
    loss: float | None = None
    _emitted: int = 0
    _emitted_at: float = -1e18

    @property
    def last_step(self) -> int | None:
        return self.points[-1][1] if self.points else None

    @property
    def first_step(self) -> int | None:
        return self.points[0][1] if self.points else None

    def update(self, p: Progress, now: float) -> None:
        if self.points and p.step <= self.points[-1][1]:
            return  # another rank's copy of a line already seen, or a restart of the count
        self.points.append((now, p.step))
        del self.points[:-1000]
        self.total = p.total or self.total
        self.epoch = p.epoch if p.epoch is not None else self.epoch
        self.loss = p.loss if p.loss is not None else self.loss

    def step_time(self, window: int = 20) -> float | None:
        pts = self.points[1:][-window:]  # the first point includes the start-up
        if len(pts) < 2 or pts[-1][1] == pts[0][1]:
            return None
        return (pts[-1][0] - pts[0][0]) / (pts[-1][1] - pts[0][1])

    def step_at(self, t: float) -> int | None:
        """The step reached at time ``t`` (the last one seen before it)."""
        before = [s for when, s in self.points if when <= t]
        return before[-1] if before else None

    def due(self, now: float) -> dict[str, Any] | None:
        """A ``steps`` line when there is news and the interval has passed."""
        step = self.last_step
        st = self.step_time()
        if step is None or st is None or step == self._emitted:
            return None
        if now - self._emitted_at < self.interval_s:
            return None
        self._emitted, self._emitted_at = step, now
        line: dict[str, Any] = {
            "event": "steps",
            "time": now,
            "step": step,
            "gpus": self.gpus,
            "global_batch": self.global_batch,
            "per_gpu_batch": self.per_gpu_batch,
            "accum_steps": 1,
            "step_time": st,
            "samples_per_s": self.global_batch / st if st > 0 else 0.0,
            "source": "sidecar",
        }
        if self.cpus_per_gpu:
            line["cpus_per_gpu"] = self.cpus_per_gpu
        if self.epoch is not None:
            line["epoch"] = self.epoch
        if self.total is not None:
            line["total_steps"] = self.total
        if self.loss is not None:
            line["loss"] = self.loss
        return line
