"""The controller's in-memory view of its store: every job's record and samples.

The controller is the store's only writer (readers such as ``hpcorch status`` only read),
so the records it read when it started plus every change it wrote since are exactly what
the store holds. It keeps them in memory instead of reading every job back each cycle, and
writes the records a cycle changed, with the samples the cycle digested, in the same
transaction that logs the cycle's intended actions, before it acts: what is durable before
an action is unchanged. If a cycle fails part-way, :meth:`Records.load` reads the view back
from the store, dropping whatever the failed cycle changed only in memory.

A job's samples are bounded whatever it reports (hpcorch/controller/thinning.py): when the
controller thins them in memory, the next write gives the store the same samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from hpcorch.controller.store import JobRecord, Sample, Store
from hpcorch.controller.thinning import (
    KEEP_FINISHED,
    KEEP_RUNNING,
    MAX_SAMPLES_PER_JOB,
    SAMPLES_PER_CYCLE,
    keep,
)


def _values(rec: JobRecord) -> tuple[Any, ...]:
    """The record's field values, to tell whether it changed (cheaper than a row)."""
    return tuple(vars(rec).values())


class Records:
    """Job records and samples as the store holds them, plus this cycle's changes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.load()

    def load(self) -> None:
        """(Re)read every record from the store; samples are read again when needed."""
        self.all: dict[int, JobRecord] = {r.slurm_id: r for r in self.store.jobs()}
        self._rows: dict[int, tuple[Any, ...]] = {s: _values(r) for s, r in self.all.items()}
        self._active = {s: r for s, r in self.all.items() if r.active}
        self._samples: dict[int, list[Sample]] = {}
        self._staged: list[Sample] = []
        self._pruned: dict[int, list[Sample]] = {}
        """Jobs whose samples were thinned: the store is given exactly these."""
        self._new: list[int] = []
        self._ended = [s for s, r in self.all.items() if not r.active]
        self.lost: set[int] = {s for s, r in self.all.items() if r.phase == "lost"}
        """Jobs marked lost: re-adopted if Slurm shows them again."""

    def __contains__(self, slurm_id: int) -> bool:
        return slurm_id in self.all

    def get(self, slurm_id: int) -> JobRecord | None:
        return self.all.get(slurm_id)

    def active(self) -> list[JobRecord]:
        """The active records (queued, starting, running, stopping), by Slurm job id."""
        return [self._active[s] for s in sorted(self._active)]

    def add(self, rec: JobRecord) -> None:
        """A new job's record, or a lost job's new one (written with the next :meth:`write`)."""
        self.all[rec.slurm_id] = rec
        self.lost.discard(rec.slurm_id)
        self._new.append(rec.slurm_id)
        if rec.active:
            self._active[rec.slurm_id] = rec
        else:
            self._ended.append(rec.slurm_id)

    def samples(self, slurm_id: int) -> list[Sample]:
        """The job's samples the controller keeps, oldest first: every one it reported up
        to the bounds of hpcorch/controller/thinning.py."""
        got = self._samples.get(slurm_id)
        if got is None:
            got = self._samples[slurm_id] = self.store.samples(slurm_id)
        return got

    def stage(self, samples: Iterable[Sample]) -> None:
        """New samples: seen at once, stored with the next :meth:`write`. At most
        ``SAMPLES_PER_CYCLE`` of a job are taken from one call; a job that reaches
        ``MAX_SAMPLES_PER_JOB`` is thinned to ``KEEP_RUNNING``."""
        by_job: dict[int, list[Sample]] = {}
        for s in samples:
            by_job.setdefault(s.slurm_id, []).append(s)
        for sid, new in by_job.items():
            if len(new) > SAMPLES_PER_CYCLE:
                new = keep(new, SAMPLES_PER_CYCLE)
            have = self.samples(sid)
            have += new
            if len(have) > MAX_SAMPLES_PER_JOB:
                self._thin(sid, KEEP_RUNNING)
            elif sid not in self._pruned:
                self._staged += new

    def _thin(self, slurm_id: int, budget: int) -> None:
        """Thin the job's samples in memory; the store follows with the next write."""
        have = self.samples(slurm_id)
        have[:] = keep(have, budget)
        self._pruned[slurm_id] = have

    def write(
        self, unstorable: Callable[[JobRecord, BaseException], JobRecord] | None = None
    ) -> None:
        """Store the staged samples and every record that changed (inside a transaction).
        A record the store refuses is replaced by ``unstorable(rec, error)`` (stored in its
        place, kept in memory); without it, the error propagates."""
        if self._staged:
            self.store.add_samples([s for s in self._staged if s.slurm_id not in self._pruned])
            self._staged = []
        for sid, kept in self._pruned.items():
            self.store.prune_samples(sid, kept)
        self._pruned = {}
        # Only active records and new ones can have changed: the cycle moves nothing else.
        dirty = []
        for sid in [*self._active, *self._new]:
            rec = self.all[sid]
            row = _values(rec)
            if row != self._rows.get(sid):
                dirty.append(rec)
                self._rows[sid] = row
        self._new = []
        if dirty:
            try:
                self.store.put_jobs(dirty)
            except Exception:
                if unstorable is None:
                    raise
                for rec in dirty:  # one by one: only the bad record is replaced
                    try:
                        self.store.put_job(rec)
                    except Exception as exc:
                        fixed = unstorable(rec, exc)
                        self.store.put_job(fixed)
                        self.all[rec.slurm_id] = fixed
                        self._rows[rec.slurm_id] = _values(fixed)
                        if rec.slurm_id in self._active:
                            self._active[rec.slurm_id] = fixed
        for sid in [s for s, r in self._active.items() if not r.active]:
            del self._active[sid]
            self._ended.append(sid)
            if self.all[sid].phase == "lost":
                self.lost.add(sid)

    def ended(self) -> list[JobRecord]:
        """Records that left the active phases since the last call (all, the first time).
        Their samples are thinned to ``KEEP_FINISHED`` (the store with the next write)."""
        out = [self.all[s] for s in self._ended]
        self._ended = []
        for rec in out:
            sid = rec.slurm_id
            held = self._samples.get(sid)
            count = len(held) if held is not None else self.store.count_samples(sid)
            if count > KEEP_FINISHED:
                self._thin(sid, KEEP_FINISHED)
        return out

    def forget_samples(self, slurm_id: int) -> None:
        """Drop an ended job's samples from memory (what was kept stays in the store)."""
        self._samples.pop(slurm_id, None)
