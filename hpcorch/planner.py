"""The batch planner: global batch size -> per-GPU micro-batch and gradient accumulation.

Shared by the scheduling policies, the controller and the in-job runtime, so that every
party computes the same split for the same inputs. Pure and deterministic.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hpcorch.protocol import PLAN_VERSION


class BatchPlanError(ValueError):
    """The requested batch cannot be planned with the given bounds."""


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step of a global batch is split over GPUs and micro-steps."""

    gpus: int
    micro_batch: int
    """Samples each GPU processes per forward/backward pass."""
    accum_steps: int
    """Forward/backward passes per optimizer step (1 = no gradient accumulation)."""

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all GPUs: micro x accumulation x GPUs."""
        return self.micro_batch * self.accum_steps * self.gpus

    def describe(self) -> str:
        return f"{self.global_batch} = {self.micro_batch} x {self.accum_steps} x {self.gpus}"


def plan_batch(
    global_batch: int, gpus: int, max_micro_batch: int, min_micro_batch: int = 1
) -> BatchPlan:
    """Split ``global_batch`` over ``gpus`` with at most ``max_micro_batch`` per pass.

    Each GPU takes ``global_batch // gpus`` samples per optimizer step, in the fewest
    accumulation steps that keep the micro-batch within the memory bound, each of
    ``per_gpu // accum`` samples (fewer passes if the samples kept fit in fewer). The
    effective global batch (micro x accum x gpus) never exceeds the request, is exact
    whenever it divides evenly, and planning it again gives the same split.
    """
    if gpus < 1:
        raise BatchPlanError(f"gpus must be >= 1, got {gpus}")
    if max_micro_batch < 1:
        raise BatchPlanError(f"max_micro_batch must be >= 1, got {max_micro_batch}")
    if min_micro_batch < 1 or min_micro_batch > max_micro_batch:
        raise BatchPlanError(
            f"min_micro_batch must be in 1..{max_micro_batch}, got {min_micro_batch}"
        )
    if global_batch < gpus * min_micro_batch:
        raise BatchPlanError(
            f"global batch {global_batch} is smaller than {gpus} GPUs x {min_micro_batch} samples"
        )
    per_gpu = global_batch // gpus
    accum = -(-per_gpu // max_micro_batch)  # ceil: fewest passes within the memory bound
    micro = per_gpu // accum
    # What is kept may need fewer passes (64 in passes of at most 12: 6 x 10 = 60 = 5 x 12):
    # take them, so that planning the effective batch again gives the same split.
    while accum > 1 and -(-(micro * accum) // max_micro_batch) < accum:
        per_gpu = micro * accum
        accum = -(-per_gpu // max_micro_batch)
        micro = per_gpu // accum
    if micro < min_micro_batch:
        raise BatchPlanError(
            f"global batch {global_batch} on {gpus} GPUs needs {accum} accumulation steps of "
            f"{micro} samples, below the minimum micro-batch {min_micro_batch}"
        )
    return BatchPlan(gpus=gpus, micro_batch=micro, accum_steps=accum)


# --- learning-rate scaling ----------------------------------------------------------------

LR_SCALING_RULES = ("none", "linear", "sqrt", "adascale")
"""Names accepted by :func:`lr_scale`."""


def adascale_gain(global_batch: int, base_batch: int, noise_scale: float) -> float:
    """AdaScale gain of training at ``global_batch`` instead of ``base_batch``.

    With per-sample gradient variance tr(S) and true gradient G, the gradient noise scale is
    B_noise = tr(S) / |G|^2. Scaling the batch by s = global_batch / base_batch scales the
    expected squared gradient norm from |G|^2 (1 + B_noise / base) to |G|^2 (1 + B_noise /
    global), and AdaScale's gain is their ratio (B_noise + base) s / (B_noise + global): 1 when
    the gradient is noise-free (a bigger batch adds nothing), s when it is all noise (the
    linear rule). Always within [1, s] for s >= 1 (and [s, 1] for s < 1).
    """
    if global_batch < 1 or base_batch < 1:
        raise ValueError("batch sizes must be >= 1")
    if not math.isfinite(noise_scale) or noise_scale < 0:
        raise ValueError(f"noise scale must be finite and >= 0, got {noise_scale}")
    s = global_batch / base_batch
    return (noise_scale + base_batch) * s / (noise_scale + global_batch)


def lr_scale(
    rule: str, global_batch: int, base_batch: int, noise_scale: float | None = None
) -> float:
    """Factor on the learning rate tuned at ``base_batch`` when training at ``global_batch``.

    ``linear``: s; ``sqrt``: sqrt(s); ``adascale``: :func:`adascale_gain` from the gradient
    noise scale, falling back to sqrt(s) until an estimate exists; ``none``: 1.
    """
    if rule not in LR_SCALING_RULES:
        raise ValueError(
            f"unknown learning-rate scaling rule {rule!r}; valid: {', '.join(LR_SCALING_RULES)}"
        )
    if global_batch < 1 or base_batch < 1:
        raise ValueError("batch sizes must be >= 1")
    s = global_batch / base_batch
    if rule == "none":
        return 1.0
    if rule == "linear":
        return s
    if rule == "adascale" and noise_scale is not None:
        return adascale_gain(global_batch, base_batch, noise_scale)
    return math.sqrt(s)


def warmup_factor(old: float, new: float, steps_since_change: int, warmup_steps: int) -> float:
    """Linear ramp of the LR factor from ``old`` to ``new`` over ``warmup_steps`` steps."""
    if warmup_steps <= 0 or steps_since_change >= warmup_steps:
        return new
    t = max(steps_since_change, 0) / warmup_steps
    return old + (new - old) * t


def clamp_global_batch(global_batch: int, lower: int | None, upper: int | None) -> int:
    """``global_batch`` within the job's bounds (either bound may be None)."""
    if lower is not None and upper is not None and lower > upper:
        raise BatchPlanError(f"global batch bounds are inverted: {lower} > {upper}")
    if lower is not None:
        global_batch = max(global_batch, lower)
    if upper is not None:
        global_batch = min(global_batch, upper)
    return global_batch


# --- the plan file: what the controller decided for one launch ---------------------------


class PlanFileError(ValueError):
    """A plan file is missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class LaunchPlan:
    """Contents of a job's plan.json, written by the controller before each launch."""

    global_batch: int
    gpus: int
    max_micro_batch: int
    job: str | None = None
    launch: int = 0
    lr_scaling: str | None = None
    """Overrides the script's rule when set."""
    version: int = PLAN_VERSION
    placement: tuple[tuple[str, int], ...] = ()
    """(node, GPUs) in rank order, as the controller asked Slurm for them: the job wrapper
    lays the ranks out in this order when the allocation matches (empty: Slurm's order)."""
    trained_step: int = 0
    """The furthest step earlier launches of the job reported (0: none): a launch that
    finds no checkpoint to resume from says in the job's log that their work is lost."""

    def batch_plan(self) -> BatchPlan:
        return plan_batch(self.global_batch, self.gpus, self.max_micro_batch)

    def to_json(self) -> str:
        doc = asdict(self)
        if not self.placement:
            del doc["placement"]  # plan files without a placement read as before
        else:
            doc["placement"] = [[n, c] for n, c in self.placement]
        if not self.trained_step:
            del doc["trained_step"]
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> LaunchPlan:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanFileError(f"{source} is not valid JSON ({e.msg} at line {e.lineno})") from e
        if not isinstance(raw, dict):
            raise PlanFileError(f"{source} must hold a JSON object")
        version = raw.get("version")
        if version != PLAN_VERSION:
            raise PlanFileError(
                f"{source} has plan version {version!r}; this hpcorch reads version {PLAN_VERSION}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise PlanFileError(f"{source} has unknown field(s): {', '.join(unknown)}")
        for name in ("global_batch", "gpus", "max_micro_batch"):
            if name not in raw:
                raise PlanFileError(f"{source} lacks the field {name!r}")
        for name in ("global_batch", "gpus", "max_micro_batch", "launch", "trained_step"):
            value = raw.get(name, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PlanFileError(f"{source}: {name} must be a non-negative integer")
        for name in ("job", "lr_scaling"):
            if raw.get(name) is not None and not isinstance(raw[name], str):
                raise PlanFileError(f"{source}: {name} must be a string")
        if raw.get("lr_scaling") not in (None, *LR_SCALING_RULES):
            raise PlanFileError(
                f"{source}: unknown lr_scaling {raw['lr_scaling']!r}; "
                f"valid: {', '.join(LR_SCALING_RULES)}"
            )
        raw["placement"] = _placement(raw.get("placement", []), source)
        plan = cls(**raw)
        try:
            plan.batch_plan()
        except BatchPlanError as e:
            raise PlanFileError(f"{source}: {e}") from e
        return plan


def _placement(value: object, source: str) -> tuple[tuple[str, int], ...]:
    """A plan's placement: a list of [node name, GPUs > 0], each node once."""
    bad = PlanFileError(f"{source}: placement must be a list of [node, GPUs] pairs")
    if not isinstance(value, list):
        raise bad
    out: list[tuple[str, int]] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise bad
        name, gpus = item
        if not isinstance(name, str) or not name or isinstance(gpus, bool):
            raise bad
        if not isinstance(gpus, int) or gpus < 1:
            raise bad
        out.append((name, gpus))
    if len({n for n, _ in out}) != len(out):
        raise PlanFileError(f"{source}: placement names a node twice")
    return tuple(out)


def read_plan(path: str | os.PathLike[str]) -> LaunchPlan:
    """Read and validate a plan file; :class:`PlanFileError` names the problem."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PlanFileError(f"cannot read plan {os.fspath(path)}: {e.strerror}") from e
    return LaunchPlan.from_json(text, source=f"plan {os.fspath(path)}")


def write_plan(path: str | os.PathLike[str], plan: LaunchPlan) -> None:
    """Write a plan file atomically (temp file, fsync, rename)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(plan.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- a plan rewritten while the launch runs (a new global batch, same GPUs) -----------


def batch_from_plan(
    plan: LaunchPlan,
    *,
    world_size: int,
    job_id: str | None,
    launch: int | None,
    lower: int | None,
    upper: int | None,
) -> BatchPlan | None:
    """The split a rewritten plan asks for, or None when it is not for this launch: another
    job's, an older launch's, or made for another GPU count (a resize relaunches)."""
    if job_id is not None and plan.job is not None and plan.job != job_id:
        return None
    if launch is not None and plan.launch < launch:
        return None
    if plan.gpus != world_size:
        return None
    try:
        bounded = clamp_global_batch(plan.global_batch, lower, upper)
        return plan_batch(bounded, world_size, plan.max_micro_batch)
    except BatchPlanError:
        return None


class PlanWatcher:
    """Rank 0's view of the plan file: a plan each time the file changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self.error = ""
        """Why the last changed file could not be read ('' when it could)."""

    def changed(self) -> LaunchPlan | None:
        """The plan, if the file changed since the last look (the first look reads it)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._seen:
            return None
        self._seen = key
        try:
            plan = read_plan(self.path)
        except PlanFileError as e:
            self.error = str(e)
            return None
        self.error = ""
        return plan
