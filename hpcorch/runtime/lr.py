"""The learning-rate factor of an elastic job: scaled with the global batch, ramped after
every change of it, applied only while the optimizer steps.

The optimizer's LR is taken as tuned for ``base_batch``. At every ``optimizer.step()`` the
factor multiplies each parameter group's LR and the LR is restored right after (optimizer
step pre/post hooks), so an LR scheduler keeps working on the unscaled value. Pure Python:
shared by the runtime and the training-library integrations.
"""

from __future__ import annotations

from typing import Any

from hpcorch.planner import lr_scale, warmup_factor


class LrFactor:
    """The factor in effect, its warm-up from the one before, and the progress it sums."""

    def __init__(self, rule: str, base_batch: int, warmup_steps: int) -> None:
        self.rule = rule
        self.base_batch = base_batch
        self.warmup_steps = warmup_steps
        self.factor = 1.0
        self.prev_factor = 1.0
        """The factor the warm-up ramps from."""
        self.since_change = 0
        """Optimizer steps since the global batch last changed."""
        self.progress = 0.0
        """Scale-invariant progress: the sum of the factors applied (AdaScale's iterations)."""
        self._saved: list[float] = []

    def update(self, global_batch: int, noise_scale: float | None) -> float:
        """The factor of the next optimizer step at ``global_batch``."""
        target = lr_scale(self.rule, global_batch, self.base_batch, noise_scale)
        self.factor = warmup_factor(self.prev_factor, target, self.since_change, self.warmup_steps)
        if self.since_change >= self.warmup_steps:
            self.prev_factor = target
        return self.factor

    def stepped(self) -> None:
        """Count one optimizer step taken at the current factor."""
        self.progress += self.factor
        self.since_change += 1

    def batch_changed(self) -> None:
        """The global batch changed: ramp from the factor in effect to the new batch's."""
        self.prev_factor = self.factor
        self.since_change = 0

    # -- applying it around optimizer.step() -----------------------------------------------
    def attach(self, optimizer: Any) -> None:
        """Scale ``optimizer``'s LR by the factor while it steps (torch's step hooks)."""
        optimizer.register_step_pre_hook(self._scale)
        optimizer.register_step_post_hook(self._unscale)

    def _scale(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._saved = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] = g["lr"] * self.factor

    def _unscale(self, opt: Any, args: Any, kwargs: Any) -> None:
        for g, lr in zip(opt.param_groups, self._saved, strict=True):
            g["lr"] = lr

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "base_batch": self.base_batch,
            "factor": self.factor,
            "prev_factor": self.prev_factor,
            "since_change": self.since_change,
            "progress": self.progress,
        }

    def load_state_dict(self, state: dict[str, Any], same_batch: bool) -> None:
        """Resume: the same global batch continues its warm-up; another one ramps from the
        factor in effect when the job stopped. The rule stays this launch's."""
        self.base_batch = int(state["base_batch"])
        self.progress = float(state["progress"])
        if same_batch:
            self.prev_factor = float(state["prev_factor"])
            self.since_change = int(state["since_change"])
        else:
            self.prev_factor = float(state["factor"])
            self.since_change = 0
