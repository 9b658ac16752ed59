"""What the controller's query socket answers: the rows ``status``, ``describe``, ``report``
and ``metrics`` need, filtered by who asks. Pure but for reading the store: a request, the
asker and a read-only store in, a JSON-ready reply out (the socket itself is
:mod:`hpcorch.controller.query_server`).

Who sees what: root and the controller's own user see everything (they can read the
state database anyway). Any other user sees their own jobs in full and other users' jobs
as ``squeue`` shows them (:data:`PUBLIC_FIELDS`: id, user, name, phase, GPUs, nodes,
times), never their directory, plan, metrics, samples, decisions or the controller's
reason text (which may name their paths). Per-user GPU time (``status``'s USAGE section,
``hpcorch_user_*`` metrics) is shown to everyone, as ``sshare`` shows fair-share usage.
"""

from __future__ import annotations

import json
import pwd
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from hpcorch.controller.store import Decision, JobRecord, Sample, Store
from hpcorch.errors import HpcorchError
from hpcorch.report import Report, from_connection

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

QUERY_VERSION = 1
SOCKET_NAME = "query.sock"
"""The socket's name in the controller's state directory."""
MAX_REQUEST = 4096
"""Bytes of one request, at most (a request is one small JSON object)."""
MAX_JOB_ID = 4_294_967_293
MAX_DECISIONS = 1000
"""``describe`` sends a job's last this many decisions (and how many it left out)."""
KINDS = ("status", "describe", "report", "metrics")

PUBLIC_FIELDS = (
    "slurm_id", "name", "user", "uid", "phase", "phase_since", "mode", "gpus", "min_gpus",
    "max_gpus", "nodes", "node_list", "launches", "resizes", "slurm_restarts", "submit_time",
    "started_at", "finished_at", "gpu_seconds", "run_seconds", "gpu_type", "gpu_types",
)  # fmt: skip
"""What anyone may see of a job: what squeue shows of it (its comment's GPU range and mode
included) and the controller's phase; its GPU time makes the per-user usage."""
_NEUTRAL = {"job_key": "", "job_dir": "", "app": "", "batch": 0, "max_batch": 0, "max_micro": 0}
_RECORD_FIELDS = {f.name for f in fields(JobRecord)}


class QueryError(HpcorchError):
    """A request refused; the message is the one line the asker sees."""


@dataclass(frozen=True)
class Viewer:
    """Who asks, from the socket's peer credentials (never from the request)."""

    uid: int
    user: str
    """The uid's name ("" when the system knows none)."""
    everything: bool
    """root or the controller's own user: sees every job in full."""

    @classmethod
    def of(cls, uid: int, own_uid: int) -> Viewer:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = ""
        return cls(uid, name, uid in (0, own_uid))

    def owns(self, rec: JobRecord) -> bool:
        """Whether the viewer sees ``rec`` in full: their own job (by the uid Slurm
        reported; by name for a record that predates uids), or everything."""
        if self.everything:
            return True
        if rec.uid >= 0:
            return rec.uid == self.uid
        return bool(self.user) and rec.user == self.user


@dataclass(frozen=True)
class Request:
    kind: str
    job: int | None = None


def parse_request(data: bytes) -> Request:
    """One request: a JSON object ``{"v": 1, "q": KIND[, "job": ID]}`` of at most
    :data:`MAX_REQUEST` bytes. Anything else is a QueryError with one line."""
    if len(data) > MAX_REQUEST:
        raise QueryError(f"request over {MAX_REQUEST} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise QueryError("the request is not one JSON object (UTF-8, one line)") from None
    if not isinstance(doc, dict):
        raise QueryError("the request is not one JSON object (UTF-8, one line)")
    unknown = sorted(str(k) for k in doc if k not in ("v", "q", "job"))
    if unknown:
        raise QueryError(f"unknown request key {unknown[0][:40]!r} (valid: v, q, job)")
    version = doc.get("v", QUERY_VERSION)
    if version != QUERY_VERSION or isinstance(version, bool):
        raise QueryError(f"unsupported request version (this controller speaks {QUERY_VERSION})")
    kind = doc.get("q")
    if kind not in KINDS:
        raise QueryError(f"unknown query (valid: {', '.join(KINDS)})")
    job = doc.get("job")
    if job is not None and (
        isinstance(job, bool) or not isinstance(job, int) or not 1 <= job <= MAX_JOB_ID
    ):
        raise QueryError(f"job must be a Slurm job id (1..{MAX_JOB_ID})")
    if kind == "describe" and job is None:
        raise QueryError("describe needs a job")
    if kind in ("status", "report") and job is not None:
        raise QueryError(f"{kind} takes no job")
    return Request(str(kind), job)


# --- the records each user may see ------------------------------------------------------
def public_record(rec: JobRecord) -> dict[str, Any]:
    """What anyone may see of ``rec``."""
    return {k: getattr(rec, k) for k in PUBLIC_FIELDS}


def record_for(viewer: Viewer, rec: JobRecord) -> dict[str, Any]:
    """``rec`` as ``viewer`` may see it, marked ``full`` or not."""
    if viewer.owns(rec):
        return {**asdict(rec), "full": True}
    return {**public_record(rec), "full": False}


def record_from(doc: dict[str, Any]) -> JobRecord:
    """A JobRecord from a reply's record (a reduced one: the rest neutral); keys this
    hpcorch does not know (a newer controller's) are ignored."""
    known = {k: v for k, v in doc.items() if k in _RECORD_FIELDS}
    return JobRecord(**{**_NEUTRAL, **known})


def throughput_by_gpus(samples: Sequence[Sample]) -> list[tuple[int, float, int]]:
    """(GPUs, median samples/s, reports) per GPU count: describe's throughput table."""
    by: dict[int, list[float]] = {}
    for s in samples:
        if s.samples_per_s > 0:
            by.setdefault(s.gpus, []).append(s.samples_per_s)
    return [(g, float(statistics.median(v)), len(v)) for g, v in sorted(by.items())]


def redact_report(report: Report, visible: Callable[[int], bool]) -> Report:
    """``report`` with other users' jobs as squeue shows them: their GPUs over time and
    resizes stay (the pool's utilisation is everyone's), their batch sizes and losses go."""
    for j in report.jobs:
        if not visible(j.job_id):
            j.batches = []
            j.final_loss = None
            j.marks = [m for m in j.marks if m.kind != "batch"]
    return report


# --- reading the store, each read shared for a moment -----------------------------------
class Reader:
    """The controller's state as the answers read it, on one read-only connection (of
    the thread that serves the socket). Whole-pool reads (the records, the report, the
    metrics) are kept ``ttl`` seconds, so a crowd of readers costs one read."""

    def __init__(self, store: Store, ttl: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self._kept: dict[str, tuple[float, Any]] = {}

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see one state of the database (one read transaction)."""
        self.store.db.execute("BEGIN")
        try:
            yield
        finally:
            self.store.db.execute("COMMIT")

    def _kept_or(self, key: str, read: Callable[[], Any]) -> Any:
        now = self.clock()
        hit = self._kept.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        with self.snapshot():
            value = read()
        self._kept[key] = (now, value)
        return value

    def records(self) -> list[JobRecord]:
        return list(self._kept_or("records", self.store.jobs))

    def listing(self, key: str) -> list[dict[str, Any]]:
        """A list the loop keeps in the store's meta: "pool" (its nodes), "foreign" (jobs
        on them it did not place; all of it squeue shows)."""
        return list(self._kept_or(key, lambda: json.loads(self.store.get_meta(key) or "[]")))

    def report(self) -> dict[str, Any]:
        """The whole report as JSON (each answer redacts its own copy)."""
        doc = self._kept_or(
            "report", lambda: from_connection(self.store.db, str(self.store.path)).to_json()
        )
        return json.loads(json.dumps(doc))  # type: ignore[no-any-return]

    def families(self) -> list[Metric]:
        from hpcorch.controller import prom

        return list(self._kept_or("metrics", lambda: list(prom.collect(self.store))))

    def job(self, job_id: int) -> tuple[JobRecord | None, list[Decision], int, list[Sample]]:
        with self.snapshot():
            rec = self.store.job(job_id)
            if rec is None:
                return None, [], 0, []
            decisions = self.store.decisions(job_id)
            samples = self.store.samples(job_id)
        left_out = max(0, len(decisions) - MAX_DECISIONS)
        return rec, decisions[left_out:], left_out, samples


# --- the answers --------------------------------------------------------------------------
def answer(req: Request, viewer: Viewer, reader: Reader) -> dict[str, Any]:
    """The reply to ``req`` from ``viewer``: ``{"ok": true, ...}``; a QueryError else."""
    head: dict[str, Any] = {"ok": True, "v": QUERY_VERSION, "user": viewer.user}
    head["everything"] = viewer.everything
    if req.kind == "status":
        records = reader.records()
        jobs = [record_for(viewer, r) for r in records]
        return {
            **head,
            "jobs": jobs,
            "pool": reader.listing("pool"),
            "foreign": reader.listing("foreign"),
        }
    if req.kind == "describe":
        assert req.job is not None
        return {**head, **_describe(req.job, viewer, reader)}
    if req.kind == "report":
        mine = {r.slurm_id for r in reader.records() if viewer.owns(r)}
        rep = redact_report(Report.from_json(reader.report()), mine.__contains__)
        return {**head, "report": rep.to_json()}
    return {**head, "metrics": _metrics(req.job, viewer, reader)}


def _describe(job_id: int, viewer: Viewer, reader: Reader) -> dict[str, Any]:
    rec, decisions, left_out, samples = reader.job(job_id)
    if rec is None:
        return {"job": None}
    if not viewer.owns(rec):
        return {"job": record_for(viewer, rec)}
    return {
        "job": record_for(viewer, rec),
        "decisions": [asdict(d) for d in decisions],
        "decisions_left_out": left_out,
        "throughput": throughput_by_gpus(samples),
    }


def not_yours(rec: JobRecord, what: str) -> QueryError:
    return QueryError(
        f"job {rec.slurm_id} is {rec.user or 'another user'}'s: its {what} are shown to "
        f"{rec.user or 'its owner'} and the admins only"
    )


def _metrics(job_id: int | None, viewer: Viewer, reader: Reader) -> str:
    records = {r.slurm_id: r for r in reader.records()}
    if job_id is not None:
        rec = records.get(job_id)
        if rec is None:
            raise QueryError(f"no job {job_id} in the controller's state")
        if not viewer.owns(rec):
            raise not_yours(rec, "metrics")
        return render_families(reader.families(), {job_id}.__contains__)
    mine = {i for i, r in records.items() if viewer.owns(r)}
    return render_families(reader.families(), mine.__contains__)


def render_families(families: Sequence[Metric], keep_job: Callable[[int], bool]) -> str:
    """The exposition text of ``families``, each per-job series only for the jobs
    ``keep_job`` keeps (the pool's and per-user series stay)."""
    from hpcorch.controller import prom

    pc = prom.client()
    out = []
    for fam in families:
        if "slurm_job_id" in {k for s in fam.samples for k in s.labels}:
            copy = type(fam).__new__(type(fam))
            copy.__dict__.update(fam.__dict__)
            copy.samples = [s for s in fam.samples if keep_job(int(s.labels["slurm_job_id"]))]
            fam = copy
        out.append(fam)

    class Kept:
        def collect(self) -> Iterator[Metric]:
            yield from out

    reg = pc.CollectorRegistry(auto_describe=False)
    reg.register(Kept())
    return pc.generate_latest(reg).decode()  # type: ignore[no-any-return]
