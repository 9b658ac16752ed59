"""The pool's jobs read through a text signature, their JSON only when it changed
(hpcorch/slurm/squeue_cache.py): what is read, when, and what is answered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from hpcorch.errors import SlurmCommandError, SlurmTimeout
from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.squeue_cache import MAX_IDS, JobCache, parse_signatures
from tests.squeue_text import signature_line

ME = 990


class FakeSlurm:
    """squeue's two answers from one list of JSON jobs; ``lines`` overrides a job's line."""

    def __init__(self, jobs: list[dict[str, Any]], ignores_filters: bool = False) -> None:
        self.jobs = jobs
        self.lines: dict[int, str] = {}
        self.ignores_filters = ignores_filters  # as 22.05 does with --json
        self.fetches: list[list[int] | None] = []
        self.now = 0.0

    def text(self) -> str:
        return "".join(self.lines.get(j["job_id"], signature_line(j)) + "\n" for j in self.jobs)

    def fetch(self, ids: Sequence[int] | None) -> Mapping[str, Any]:
        self.fetches.append(None if ids is None else sorted(ids))
        if ids is None or self.ignores_filters:
            return {"jobs": list(self.jobs)}
        return {"jobs": [j for j in self.jobs if j["job_id"] in ids]}

    def cache(self, max_age_s: float = 60.0) -> JobCache:
        return JobCache("pool", self.fetch, self.text, ME, max_age_s, clock=lambda: self.now)


def job(job_id: int, resv: str = "pool", state: str = "RUNNING", **more: Any) -> dict[str, Any]:
    return {"job_id": job_id, "resv_name": resv, "job_state": state, "user_id": 1001, **more}


def ids(cache: JobCache) -> list[int]:
    return [j.job_id for j in cache.jobs()]


def test_an_unchanged_queue_is_read_as_text_alone() -> None:
    slurm = FakeSlurm([job(1), job(2, comment="a"), job(3, resv="other")])
    cache = slurm.cache()
    assert ids(cache) == [1, 2]
    assert slurm.fetches == [None]
    slurm.now = 10.0
    jobs = cache.jobs()
    assert [j.job_id for j in jobs] == [1, 2] and jobs[1].comment == "a"
    assert slurm.fetches == [None]  # no JSON read


def test_a_changed_job_alone_is_read_again() -> None:
    slurm = FakeSlurm([job(1), job(2), job(3)])
    cache = slurm.cache()
    cache.jobs()
    slurm.jobs[1] = job(2, state="COMPLETED")
    slurm.jobs.append(job(4, state="PENDING"))
    slurm.now = 5.0
    jobs = {j.job_id: j for j in cache.jobs()}
    assert slurm.fetches == [None, [2, 4]]
    assert (
        jobs[2].state == "COMPLETED" and jobs[4].state == "PENDING" and jobs[1].state == "RUNNING"
    )


def test_a_job_gone_from_the_text_is_gone_without_a_json_read() -> None:
    slurm = FakeSlurm([job(1), job(2)])
    cache = slurm.cache()
    cache.jobs()
    del slurm.jobs[0]
    assert ids(cache) == [2] and slurm.fetches == [None]


def test_every_job_is_read_again_after_max_age() -> None:
    """What a user may change without a signature change (the comment) is seen within
    max_age."""
    slurm = FakeSlurm([job(1, comment="old")])
    cache = slurm.cache(max_age_s=30.0)
    cache.jobs()
    slurm.jobs[0] = job(1, comment="new")
    slurm.now = 29.0
    assert cache.jobs()[0].comment == "old"
    slurm.now = 30.0
    assert cache.jobs()[0].comment == "new" and slurm.fetches == [None, None]


def test_a_spoofed_line_makes_a_full_read_and_keys_nothing() -> None:
    """A job's line copied into another's (a name or comment printed with a newline and a
    forged line, were one ever in the text) appears twice: nothing is taken from either."""
    slurm = FakeSlurm([job(1), job(2)])
    cache = slurm.cache()
    cache.jobs()
    slurm.jobs[0] = job(1, state="COMPLETED")
    forged = signature_line(job(1))  # job 1 as it was, to keep the old JSON
    slurm.lines[2] = signature_line(job(2)) + "\n" + forged
    slurm.now = 1.0
    jobs = {j.job_id: j for j in cache.jobs()}
    assert slurm.fetches[-1] is None  # a full read
    assert jobs[1].state == "COMPLETED"


def test_an_array_in_the_pool_makes_every_read_full() -> None:
    slurm = FakeSlurm([job(1), job(2)])
    slurm.lines[2] = "2_[1-4]|pool|1001|PENDING|"
    cache = slurm.cache()
    cache.jobs()
    slurm.now = 1.0
    cache.jobs()
    assert slurm.fetches == [None, None]


def test_an_array_outside_the_pool_changes_nothing() -> None:
    slurm = FakeSlurm([job(1), job(2, resv="")])
    slurm.lines[2] = "2_[1-4]|(null)|1001|PENDING|"
    cache = slurm.cache()
    cache.jobs()
    slurm.now = 1.0
    cache.jobs()
    assert slurm.fetches == [None]


def test_an_answer_with_every_job_refreshes_every_job() -> None:
    """22.05 answers ``squeue --json -j 2`` with every job: all are read afresh (and the
    age starts again)."""
    slurm = FakeSlurm([job(1, comment="a"), job(2)], ignores_filters=True)
    cache = slurm.cache(max_age_s=30.0)
    cache.jobs()
    slurm.jobs[0] = job(1, comment="b")
    slurm.jobs[1] = job(2, state="COMPLETED")
    slurm.now = 20.0
    jobs = {j.job_id: j for j in cache.jobs()}
    assert slurm.fetches == [None, [2]] and jobs[1].comment == "b"
    slurm.now = 45.0
    cache.jobs()
    assert slurm.fetches == [None, [2]]  # 25 s since that read, not 45


def test_a_lease_job_is_read_every_time_on_its_own() -> None:
    """Another controller takes the lease by writing the lease job's comment, which no
    signature shows: the lease job's JSON is read every time, one job a call (one job's
    RPC and JSON on every release)."""
    slurm = FakeSlurm([job(1), job(2, comment="hpcorch-lease:owner=a"), job(3)])
    cache = JobCache(
        "pool", slurm.fetch, slurm.text, ME, clock=lambda: slurm.now,
        volatile=lambda j: j.comment.startswith("hpcorch-lease:"),
    )  # fmt: skip
    cache.jobs()
    slurm.jobs[1] = job(2, comment="hpcorch-lease:owner=b")
    slurm.jobs[2] = job(3, state="COMPLETED")
    slurm.now = 1.0
    jobs = {j.job_id: j for j in cache.jobs()}
    assert jobs[2].comment == "hpcorch-lease:owner=b"
    assert slurm.fetches == [None, [3], [2]]


def test_the_backend_reads_its_lease_job_every_time() -> None:
    lease = job(5, comment="hpcorch-lease:owner=h:1,token=ab,seq=1,beat=0")
    cli = RecordingCLI(FakeSlurm([job(4), lease]))
    cli.jobs("pool")
    cli.argv.clear()
    cli.jobs("pool")
    assert [a[-1] for a in cli.argv if "--json" in a] == ["--jobs=5"]


def test_a_forgotten_job_is_read_again() -> None:
    slurm = FakeSlurm([job(1), job(2)])
    cache = slurm.cache()
    cache.jobs()
    cache.forget([2])
    cache.jobs()
    assert slurm.fetches == [None, [2]]


def test_jobs_outside_the_pool_are_read_only_when_they_are_this_users() -> None:
    """Lease jobs may sit outside the reservation: this user's jobs are read, a site's
    other jobs never are."""
    lease = job(5, resv="", name="hpcorch-lease", user_id=ME)
    slurm = FakeSlurm([job(1), job(3, resv=""), lease, job(6, resv="", user_id=ME)])
    cache = slurm.cache()
    assert ids(cache) == [1, 5]
    assert set(parse_signatures(slurm.text(), "pool", ME).lines) == {1, 5, 6}
    slurm.jobs.append(job(7, resv=""))
    slurm.now = 1.0
    assert ids(cache) == [1, 5] and slurm.fetches == [None]


def test_many_changes_are_one_full_read() -> None:
    slurm = FakeSlurm([job(i) for i in range(1, MAX_IDS + 3)])
    cache = slurm.cache()
    cache.jobs()
    slurm.jobs = [job(i, state="COMPLETED") for i in range(1, MAX_IDS + 3)]
    slurm.now = 1.0
    cache.jobs()
    assert slurm.fetches == [None, None]


def test_a_job_new_since_the_text_is_answered_once_and_read_again() -> None:
    slurm = FakeSlurm([job(1)])
    cache = slurm.cache()
    text = slurm.text()
    slurm.jobs.append(job(2))
    cache._signatures = lambda: text  # the text read before job 2 was submitted
    assert ids(cache) == [1, 2]
    cache._signatures = slurm.text
    slurm.now = 1.0
    assert ids(cache) == [1, 2] and slurm.fetches == [None, [2]]


def test_a_job_gone_before_its_json_read_makes_a_full_read() -> None:
    """``squeue --json -j 2`` asks slurmctld for job 2 alone and fails once it is purged."""
    slurm = FakeSlurm([job(1), job(2)])
    cache = slurm.cache()
    cache.jobs()
    slurm.jobs[1] = job(2, state="COMPLETED")
    fetch = slurm.fetch

    def purged(wanted: Sequence[int] | None) -> Mapping[str, Any]:
        if wanted is not None:
            slurm.fetches.append(sorted(wanted))
            raise SlurmCommandError(
                "squeue failed: slurm_load_jobs error: Invalid job id specified"
            )
        del slurm.jobs[1]
        return fetch(None)

    cache._fetch = purged
    slurm.now = 1.0
    assert ids(cache) == [1] and slurm.fetches == [None, [2], None]


def test_a_json_read_that_times_out_is_not_followed_by_a_full_one() -> None:
    """A slurmctld that answers slowly: the cycle fails at once (a slow spell, said by the
    service) rather than wait again for every job's JSON."""
    slurm = FakeSlurm([job(1), job(2)])
    cache = slurm.cache()
    cache.jobs()
    slurm.jobs[1] = job(2, state="COMPLETED")

    def slow(wanted: Sequence[int] | None) -> Mapping[str, Any]:
        slurm.fetches.append(None if wanted is None else sorted(wanted))
        raise SlurmTimeout("squeue did not finish within 30 s (slurmctld answers)")

    cache._fetch = slow
    slurm.now = 1.0
    with pytest.raises(SlurmTimeout):
        cache.jobs()
    assert slurm.fetches == [None, [2]]


class RecordingCLI(SlurmCLI):
    def __init__(self, slurm: FakeSlurm) -> None:
        super().__init__()
        self.slurm = slurm
        self.argv: list[list[str]] = []

    def run(self, argv: Sequence[str], stdin: str | None = None, env: Any = None) -> str:
        self.argv.append(list(argv))
        if argv[0] == "squeue" and "--json" not in argv:
            return self.slurm.text()
        return ""

    def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        self.argv.append(list(argv))
        jobs = [a.removeprefix("--jobs=") for a in argv if a.startswith("--jobs=")]
        return dict(self.slurm.fetch([int(j) for j in jobs[0].split(",")] if jobs else None))


def test_the_backend_reads_a_job_it_acted_on_afresh() -> None:
    slurm = FakeSlurm([job(11), job(12), job(13)])
    cli = RecordingCLI(slurm)
    cli.jobs("pool")
    cli.set_shape(12, 1, 4)
    cli.scontrol("hold", "11,13")
    cli.cancel(12, signal="USR2", batch_only=True)
    cli.argv.clear()
    cli.jobs("pool")
    assert cli.argv[0][:3] == ["squeue", "--noheader", "--states=all"]
    assert cli.argv[1] == ["squeue", "--json", "--states=all", "--jobs=11,12,13"]
    cli.argv.clear()
    cli.jobs("pool")
    assert len(cli.argv) == 1  # text alone
    assert [j.job_id for j in cli.jobs()] == [11, 12, 13]  # every job: the JSON, uncached


def test_the_age_set_after_the_first_read_applies() -> None:
    """The controller reads the pool's jobs at start-up (its state check) and only then
    sets the age to its round: the cache made by that first read follows it."""
    clock = [0.0]
    cache_slurm = FakeSlurm([job(1)])
    cli = RecordingCLI(cache_slurm)
    cli.jobs("pool")
    cli._caches["pool"].clock = lambda: clock[0]
    cli.job_cache_age_s = 5.0
    clock[0] = 1e9  # (the first read's clock was monotonic time)
    cli.jobs("pool")
    cli.argv.clear()
    clock[0] += 6.0
    cli.jobs("pool")
    assert any("--json" in a for a in cli.argv)  # every job read again after 5 s, not 60
