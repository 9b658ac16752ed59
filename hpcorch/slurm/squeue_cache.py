"""The pool's jobs from squeue at a text price: ``SlurmCLI.jobs(reservation)``'s cache.

``squeue --json`` costs a cycle most of its time at a site's scale: every job, every field,
serialised by the command itself (Slurm 22.05 lists every job whatever the filters: 6.8 MB
for 1,716 jobs, 0.6 s from a calm slurmctld and 10 s or more under load; 25.11 about 15 kB
a job). The same jobs as text, a few fields each, take a tenth of that. So each cycle reads
a text *signature* of every job (``SIGNATURE``: what Slurm changes when a job starts, ends,
is held, requeued, resized or moved: state, reason, nodes, counts, limits, times, TRES,
priority), and asks ``squeue --json`` only for the jobs whose signature changed since their
JSON was read (``-j``: Slurm 23.02+ answers for those alone; 22.05 answers with every job,
and then every job is read afresh), for the jobs the cache has not seen, and for every job
at least every ``max_age`` seconds (what a job's owner may change without a signature
change: its comment, name or directory). A job the backend itself acted on is read again
at the next cycle.

The signature holds only what Slurm and the site's admins write (no job name, comment or
path): its first fields are the job id, the reservation and the owner's uid, each split off
at the first separators; the rest is compared whole. A line whose id is not a plain job id
(an array or heterogeneous job) or appears twice makes the next read a full one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcorch.errors import SlurmCommandError, SlurmTimeout
from hpcorch.slurm.parse import SlurmJob, job_id_of, parse_squeue

SIGNATURE = (
    "JobID",
    "Reservation",
    "UserId",
    "State",
    "Reason",
    "NodeList",
    "NumNodes",
    "NumCPUs",
    "TimeLimit",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "Partition",
    "PriorityLong",
    "Account",
    "QOS",
    "Requeue",
    "RestartCnt",
    "tres-per-node",
    "tres-per-job",
    "cpus-per-tres",
    "tres-alloc",
)
SEP = "|"
SIGNATURE_ARGV = [
    "squeue",
    "--noheader",
    "--states=all",
    "--Format=" + ",".join(f"{f}:{SEP}" for f in SIGNATURE),
]
"""Every field ends in ``SEP`` with no width: squeue prints it whole, unpadded."""
MAX_IDS = 500
"""More changed jobs than this: one full ``squeue --json`` rather than a long ``-j`` list."""
MAX_AGE_S = 60.0


@dataclass
class Signatures:
    """One text read: job id -> its line, of the jobs that may be the pool's."""

    lines: dict[int, str] = field(default_factory=dict)
    complete: bool = True
    """False: a line the cache cannot key (an array, a duplicate id): read everything."""


def parse_signatures(text: str, reservation: str, uid: int) -> Signatures:
    """The lines of ``reservation``'s jobs and of ``uid``'s jobs (the controller's own lease
    jobs, which may sit outside it), keyed by job id."""
    out = Signatures()
    seen: set[int] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(SEP, 3)
        if len(parts) < 4:
            out.complete = False
            continue
        key, resv, owner = parts[0].strip(), parts[1].strip(), parts[2].strip()
        ours = resv == reservation or owner == str(uid)
        if not key.isdigit():
            out.complete = out.complete and not ours
            continue
        job_id = int(key)
        if job_id in seen:
            out.complete = False
            out.lines.pop(job_id, None)
            continue
        seen.add(job_id)
        if ours:
            out.lines[job_id] = line
    return out


@dataclass
class _Entry:
    line: str
    job: SlurmJob | None
    """None: read, but not the pool's (outside it and not a lease job)."""


class JobCache:
    """The pool's jobs as the last JSON read gave them, valid while their signature holds.

    ``fetch(ids)``: ``squeue --json`` for those jobs (None: every job); ``signatures()``:
    the text of the signature read. Thread-safe: actions call ``forget`` from their
    threads."""

    def __init__(
        self,
        reservation: str,
        fetch: Callable[[Sequence[int] | None], Mapping[str, Any]],
        signatures: Callable[[], str],
        uid: int,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        volatile: Callable[[SlurmJob], bool] = lambda job: False,
    ) -> None:
        self.reservation = reservation
        self._fetch, self._signatures = fetch, signatures
        self.uid, self.max_age_s, self.clock = uid, max_age_s, clock
        self.volatile = volatile
        """Jobs read as JSON every time, one call each (the pool's lease jobs: another
        controller takes the lease by writing their comment, which no signature shows)."""
        self._entries: dict[int, _Entry] = {}
        self._full_at = -1e18
        self._lock = threading.Lock()
        self.full_reads = 0
        self.partial_reads = 0
        self.jobs_read = 0
        """How many JSON reads of each kind, and jobs they brought (for the benchmarks)."""

    def forget(self, job_ids: Iterable[int]) -> None:
        with self._lock:
            for j in job_ids:
                self._entries.pop(j, None)

    def jobs(self) -> list[SlurmJob]:
        sigs = parse_signatures(self._signatures(), self.reservation, self.uid)
        now = self.clock()
        with self._lock:
            stale = [
                j
                for j, line in sigs.lines.items()
                if j not in self._entries or self._entries[j].line != line
            ]
            full = (
                not sigs.complete or now - self._full_at >= self.max_age_s or len(stale) > MAX_IDS
            )
            volatile = [
                j
                for j, e in self._entries.items()
                if j in sigs.lines and j not in stale and e.job is not None and self.volatile(e.job)
            ]
        extra: dict[int, SlurmJob] = {}
        read: set[int] = set()
        if full or stale:
            read = self._read(None if full else stale, sigs, now, extra)
        for j in volatile:
            if j not in read:  # one job: one job's RPC and JSON on every release
                read |= self._read([j], sigs, now, extra)
        with self._lock:
            self._entries = {j: e for j, e in self._entries.items() if j in sigs.lines}
            jobs = {j: e.job for j, e in self._entries.items() if e.job is not None}
        return sorted({**jobs, **extra}.values(), key=lambda j: j.job_id)

    def _read(
        self,
        wanted: Sequence[int] | None,
        sigs: Signatures,
        now: float,
        extra: dict[int, SlurmJob],
    ) -> set[int]:
        """``squeue --json`` of ``wanted`` (None: every job) into the cache; the ids read.
        The pool's jobs new since the text go to ``extra``: answered this once, read again
        with their line."""
        try:
            doc = self._fetch(wanted)
        except SlurmTimeout:
            raise  # (slurmctld answers slowly: a read of every job would wait longer)
        except SlurmCommandError:
            if wanted is None:
                raise
            # squeue asked for one job asks slurmctld for that one, and fails when it has
            # gone since the text ("Invalid job id specified"): ask for every job instead
            doc, wanted = self._fetch(None), None
        raw = [j for j in doc.get("jobs", []) if isinstance(j, Mapping)]
        answered = {job_id_of(j) for j in raw}
        mine = {j.job_id: j for j in parse_squeue(doc, self.reservation)}
        # every job it follows read afresh (also 22.05's answer to a few ids: all jobs)
        everything = wanted is None or answered >= set(sigs.lines)
        with self._lock:
            if everything:
                self._full_at = now
                self._entries.clear()
            self.full_reads += everything
            self.partial_reads += not everything
            self.jobs_read += len(raw)
            for j in answered & set(sigs.lines):
                self._entries[j] = _Entry(sigs.lines[j], mine.get(j))
        extra.update((j, job) for j, job in mine.items() if j not in sigs.lines)
        return answered
