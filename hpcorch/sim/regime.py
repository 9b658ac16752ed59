"""Information regimes: how much a policy knows about a job before it runs.

* ``known`` (the default): jobs report their application name, so a policy may pool what
  it learned from every job of an application (running and completed). In the bundled
  workloads every job of an application is the same model.
* ``cold``: every job is new. Each job is its own application (its name is its job id)
  and no completed job is shown, so nothing is pooled: a policy knows only what the job
  reports about itself.
* ``mixed``: every other job (by arrival) is new, the rest are known; completed jobs are
  shown only for the known ones.

Orthogonal to what is pooled, ``lengths`` says which jobs declare how long they train
(epochs and dataset size, as ``hpcorch submit --epochs --dataset-size`` or the runtime's
start event): ``all`` (the default), ``none`` or ``half`` (every other job by arrival, the
first included). A job that declares nothing is shown as the controller shows it: the
placeholders of :func:`hpcorch.controller.snapshot.job_view` (its current epoch + 1, one
step per epoch) and ``JobView.length_known`` False. Two named regimes combine them:
``no-length`` is ``cold`` where no job declares its length, ``half-length`` is ``cold``
where half do.

A regime is applied to what the policy sees (:func:`regime_view`), identically in both
engines (the controller engine's simulated jobs leave their length out of what they
submit and report, and the controller makes the placeholders itself). ``epochs`` scales
the training length the jobs declare (0.5: half, 2: twice the epochs they really need),
for robustness figures; the jobs still train to their true end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcorch.policy.types import Plan, Policy, Snapshot

KINDS = ("known", "cold", "mixed")
LENGTHS = ("all", "none", "half")
NAMED = {"no-length": ("cold", "none"), "half-length": ("cold", "half")}
REGIMES = (*KINDS, *NAMED)


@dataclass(frozen=True)
class Regime:
    """What jobs tell the policy about themselves before they ran."""

    kind: str = "known"
    epochs: float = 1.0
    """Declared epochs / true epochs."""
    lengths: str = "all"
    """Which jobs declare their length: all, none, half (every other one by arrival)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown regime {self.kind!r} (valid: {', '.join(REGIMES)})")
        if self.lengths not in LENGTHS:
            raise ValueError(f"unknown lengths {self.lengths!r} (valid: {', '.join(LENGTHS)})")
        if not self.epochs > 0:
            raise ValueError(f"declared epochs factor must be positive, got {self.epochs}")

    @classmethod
    def named(cls, name: str, epochs: float = 1.0, lengths: str | None = None) -> Regime:
        """The regime called ``name`` (one of REGIMES); ``lengths`` overrides its lengths."""
        if name in NAMED:
            kind, says = NAMED[name]
        elif name in KINDS:
            kind, says = name, "all"
        else:
            raise ValueError(f"unknown regime {name!r} (valid: {', '.join(REGIMES)})")
        return cls(kind, epochs, lengths or says)

    @property
    def name(self) -> str:
        """``known``, ``cold``, ``mixed``, ``no-length``, ``half-length``, or the kind and
        its lengths (``known, no lengths``)."""
        for name, (kind, says) in NAMED.items():
            if (self.kind, self.lengths) == (kind, says):
                return name
        if self.lengths == "all":
            return self.kind
        return f"{self.kind}, {'no' if self.lengths == 'none' else 'half'} lengths"

    @property
    def plain(self) -> bool:
        """Shows every job as it is (the default regime)."""
        return self.kind == "known" and self.epochs == 1.0 and self.lengths == "all"

    def declares(self, index: int) -> bool:
        """Whether the ``index``-th job by arrival (from 0) declares its length."""
        return self.lengths == "all" or (self.lengths == "half" and index % 2 == 0)


def _new(job_id: str, submit: dict[str, int], kind: str) -> bool:
    if kind == "cold":
        return True
    if kind == "mixed":
        return submit.get(job_id, 0) % 2 == 1
    return False


def regime_view(snapshot: Snapshot, regime: Regime, order: dict[str, int]) -> Snapshot:
    """``snapshot`` as a policy sees it under ``regime``; ``order`` ranks jobs by arrival."""
    if regime.plain:
        return snapshot
    jobs = []
    for j in snapshot.jobs:
        changes: dict[str, object] = {}
        if _new(j.job_id, order, regime.kind):
            changes["application"] = f"new:{j.job_id}"
        if not regime.declares(order.get(j.job_id, 0)):
            # the controller's placeholders (hpcorch.controller.snapshot.job_view)
            changes.update(max_epochs=j.epoch + 1, progress_per_epoch_hint=1.0)
            changes["length_known"] = False
        elif regime.epochs != 1.0:
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
    if regime is None or regime.plain:
        return policy
    return InRegime(policy, regime)
