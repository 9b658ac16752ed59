"""Pure scheduling policies: a snapshot of jobs and the pool in, a plan out (numpy only)."""

from __future__ import annotations

from collections.abc import Callable

from hpcorch.policy.aiturbo import AiturboPolicy
from hpcorch.policy.fifo import FifoPolicy
from hpcorch.policy.gavel import GavelPolicy
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.share import SharePolicy
from hpcorch.policy.sidecar import SidecarPolicy
from hpcorch.policy.tiresias import TiresiasPolicy
from hpcorch.policy.types import (
    CompletedJob,
    CpuSample,
    JobPlan,
    JobView,
    Plan,
    PlanError,
    Policy,
    Snapshot,
    StepSample,
    validate_plan,
)
from hpcorch.policy.typewrap import PerType

POLICIES: dict[str, Callable[[int], Policy]] = {
    "fifo": lambda seed: FifoPolicy(),
    "tiresias": lambda seed: TiresiasPolicy(),
    "ones": lambda seed: OnesPolicy(seed=seed),
    "aiturbo": lambda seed: AiturboPolicy(),
    "sidecar": lambda seed: SidecarPolicy(),
    "share": lambda seed: SharePolicy(),
    "share-batch": lambda seed: SharePolicy(name="share-batch", tune_batch=True),
    "gavel": lambda seed: GavelPolicy(),
}


TYPE_AWARE = frozenset({"ones", "gavel"})
"""Policies that plan GPU types themselves; the others run one instance per type on a pool
of several (:class:`hpcorch.policy.typewrap.PerType`)."""


def make_policy(name: str, seed: int = 0) -> Policy:
    """A fresh policy object by name (one of ``POLICIES``)."""
    if name in TYPE_AWARE:
        return POLICIES[name](seed)
    return PerType(lambda: POLICIES[name](seed), name=name)


__all__ = [
    "POLICIES",
    "CompletedJob",
    "CpuSample",
    "JobPlan",
    "JobView",
    "Plan",
    "PlanError",
    "Policy",
    "Snapshot",
    "StepSample",
    "make_policy",
    "validate_plan",
]
