"""Convergence model: statistical efficiency from the gradient noise scale (pure numpy).

A job reports per epoch the squared gradient norm and the gradient variance measured at
its current batch. With learning-rate scaling by the gain ratio (AdaScale-style), one
optimizer step at global batch ``M`` makes

    gain(M) = (var + sqr) / (var / scale + sqr),   scale = M / M0

steps' worth of progress at the initial batch ``M0``: ``1`` at ``M0``, growing to at most
``(var + sqr) / sqr`` - beyond the noise scale a larger batch only wastes samples.
Remaining work is the epochs left times the progress one epoch makes.
"""

from __future__ import annotations

import numpy as np


def gain(batch: np.ndarray, init_batch: float, grad_sqr: float, grad_var: float) -> np.ndarray:
    """Progress per optimizer step (in steps at ``init_batch``) at global ``batch``."""
    scale = np.asarray(batch, dtype=float) / init_batch
    sqr = max(grad_sqr, 1e-30)
    var = max(grad_var, 0.0)
    return np.asarray((var + sqr) / (var / scale + sqr))


def remaining_progress(
    progress: float, epoch: int, max_epochs: int, per_epoch_hint: float
) -> float:
    """Progress still to make: epochs left x progress per epoch (measured once known)."""
    per_epoch = progress / epoch if epoch > 0 else per_epoch_hint
    per_epoch = min(per_epoch, per_epoch_hint) if per_epoch_hint > 0 else per_epoch
    return max(per_epoch * max_epochs - progress, 0.05 * per_epoch)


def noise_ratio(grad_sqr: float, grad_var: float) -> float:
    return max(grad_var, 0.0) / max(grad_sqr, 1e-30)


def reference_curve(references: list[np.ndarray], max_epochs: int) -> np.ndarray | None:
    """Median per-epoch noise ratio over completed runs that reached ``max_epochs``."""
    refs = [r[:max_epochs] for r in references if len(r) >= max_epochs]
    if not refs:
        return None
    return np.asarray(np.median(np.stack(refs), axis=0))


def forecast_noise(
    epoch: int,
    max_epochs: int,
    current: float,
    references: list[np.ndarray] | np.ndarray | None,
    growth: float = 1.0,
) -> np.ndarray:
    """Noise ratio (grad_var / grad_sqr) expected in epochs ``epoch .. max_epochs - 1``.

    The noise scale grows as training converges. With ``references`` (per-epoch ratios of
    completed jobs of the same application) the median reference curve is followed,
    rescaled to the job's current ratio (square-root damped); without, the ratio is
    assumed to grow like ``((e + 1) / (epoch + 1)) ** growth``.
    """
    epochs = np.arange(epoch, max_epochs)
    cur = max(current, 1e-6)
    if isinstance(references, list):
        references = reference_curve(references, max_epochs)
    if references is not None and len(references) >= max_epochs:
        ref = references
        base = max(float(ref[min(epoch, max_epochs - 1)]), 1e-6)
        scale = float(np.clip(np.sqrt(cur / base), 0.3, 3.0))
        return np.asarray(np.maximum(ref[epoch:max_epochs] * scale, 0.0))
    return np.asarray(cur * ((epochs + 1.0) / (epoch + 1.0)) ** growth)
