"""Information regimes: how much a policy knows about a job before it runs.

* ``known`` (the default): jobs report their application name, so a policy may pool what
  it learned from every job of an application (running and completed). In the bundled
  workloads every job of an application is the same model.
* ``cold``: every job is new. Each job is its own application (its name is its job id)
  and no completed job is shown, so nothing is pooled: a policy knows only what the job
  reports about itself.
* ``mixed``: every other job (by arrival) is new, the rest are known; completed jobs are
  shown only for the known ones.

A regime is applied to what the policy sees (:func:`regime_view`), identically in both
engines. ``epochs`` scales the training length the jobs declare (0.5: half, 2: twice the
epochs they really need), for robustness figures; the jobs still train to their true end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcorch.policy.types import Plan, Policy, Snapshot

REGIMES = ("known", "cold", "mixed")


@dataclass(frozen=True)
class Regime:
    """What jobs tell the policy about themselves before they ran."""

    kind: str = "known"
    epochs: float = 1.0
    """Declared epochs / true epochs."""

    def __post_init__(self) -> None:
        if self.kind not in REGIMES:
            raise ValueError(f"unknown regime {self.kind!r} (valid: {', '.join(REGIMES)})")
        if not self.epochs > 0:
            raise ValueError(f"declared epochs factor must be positive, got {self.epochs}")


def _new(job_id: str, submit: dict[str, int], kind: str) -> bool:
    if kind == "cold":
        return True
    if kind == "mixed":
        return submit.get(job_id, 0) % 2 == 1
    return False


def regime_view(snapshot: Snapshot, regime: Regime, order: dict[str, int]) -> Snapshot:
    """``snapshot`` as a policy sees it under ``regime``; ``order`` ranks jobs by arrival."""
    if regime.kind == "known" and regime.epochs == 1.0:
        return snapshot
    jobs = []
    for j in snapshot.jobs:
        changes: dict[str, object] = {}
        if _new(j.job_id, order, regime.kind):
            changes["application"] = f"new:{j.job_id}"
        if regime.epochs != 1.0:
            changes["max_epochs"] = max(1, round(j.max_epochs * regime.epochs))
        jobs.append(replace(j, **changes) if changes else j)  # type: ignore[arg-type]
    history = snapshot.history
    if regime.kind != "known":
        history = tuple(h for h in history if not _new(h.job_id, order, regime.kind))
    return replace(snapshot, jobs=tuple(jobs), history=history)


@dataclass
class InRegime:
    """``inner`` fed the snapshots of ``regime``; jobs are ranked by arrival as they appear."""

    inner: Policy
    regime: Regime

    def __post_init__(self) -> None:
        self.name = self.inner.name
        self._order: dict[str, int] = {}

    @property
    def sees_fixed(self) -> bool:
        """As the wrapped policy (see :func:`hpcorch.policy.split.split_schedule`)."""
        return bool(getattr(self.inner, "sees_fixed", False))

    def schedule(self, snapshot: Snapshot) -> Plan:
        for j in sorted(snapshot.jobs, key=lambda j: (j.submit_time, j.job_id)):
            self._order.setdefault(j.job_id, len(self._order))
        return self.inner.schedule(regime_view(snapshot, self.regime, self._order))


def in_regime(policy: Policy, regime: Regime | None) -> Policy:
    """``policy`` as it runs under ``regime`` (itself in the default regime)."""
    if regime is None or (regime.kind == "known" and regime.epochs == 1.0):
        return policy
    return InRegime(policy, regime)
