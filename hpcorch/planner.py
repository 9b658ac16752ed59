"""The batch planner: global batch size -> per-GPU micro-batch and gradient accumulation.

Shared by the scheduling policies, the controller and the in-job runtime, so that every
party computes the same split for the same inputs. Pure and deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    Uses the fewest accumulation steps that keep the micro-batch within the memory bound,
    then the largest micro-batch such that micro x accum x gpus <= global_batch. The
    effective global batch therefore never exceeds the request and is exact whenever
    ``global_batch`` is divisible by ``gpus x accum``.
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
            f"global batch {global_batch} is smaller than {gpus} GPUs x "
            f"{min_micro_batch} samples"
        )
    accum = -(-global_batch // (gpus * max_micro_batch))  # ceil division
    micro = global_batch // (gpus * accum)
    if micro < min_micro_batch:
        raise BatchPlanError(
            f"global batch {global_batch} on {gpus} GPUs needs {accum} accumulation steps of "
            f"{micro} samples, below the minimum micro-batch {min_micro_batch}"
        )
    return BatchPlan(gpus=gpus, micro_batch=micro, accum_steps=accum)
