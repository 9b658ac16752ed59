"""Slurm's limits read from real output (tests/fixtures/slurm-*/assoc_mgr.txt,
partitions.txt and limits-squeue.json, recorded by tests/fixtures/record-limits on 22.05
and 25.11): both releases parse to the same values, and the caps each job of the recording
is bound by, with what its groups hold outside the pool, are the ones Slurm applies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcorch.limits import Amounts
from hpcorch.slurm.assoc_mgr import (
    AssocMgrError,
    counted,
    parse_assoc_mgr,
    parse_partitions,
    tres_counted,
)
from hpcorch.slurm.limits import caps_of_job, limit_book, rekey
from hpcorch.slurm.parse import parse_squeue

FIXTURES = Path(__file__).parent / "fixtures"
RELEASES = ["22.05", "25.11"]
ALICE, BOB = 1001, 1002


def load(release: str):  # type: ignore[no-untyped-def]
    d = FIXTURES / f"slurm-{release}"
    mgr = parse_assoc_mgr((d / "assoc_mgr.txt").read_text())
    parts = parse_partitions((d / "partitions.txt").read_text())
    jobs = {j.job_id: j for j in parse_squeue(json.loads((d / "limits-squeue.json").read_text()))}
    return mgr, parts, jobs


def test_values_and_usage() -> None:
    assert counted("4(2)") == (4, 2)
    assert counted("N(2)") == (None, 2)
    assert counted("120") == (120, None)
    assert counted("") == (None, None)
    assert counted("N(0.00)") == (None, 0)
    assert tres_counted("cpu=N(2),gres/gpu=8(2)") == {"cpu": (None, 2), "gres/gpu": (8, 2)}
    with pytest.raises(AssocMgrError):
        parse_assoc_mgr("scontrol: error: something else")


@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_limits_and_usage(release: str) -> None:
    mgr, parts, _ = load(release)
    assert mgr.users == {"root": 0, "hpcorch-alice": ALICE, "hpcorch-bob": BOB}
    assert mgr.default_account["hpcorch-bob"] == "physics"
    normal = mgr.qos["normal"]
    assert normal.grp.jobs == (20, 2) and normal.grp.tres["gres/gpu"] == (12, 2)
    assert normal.per_job.tres == {"cpu": 16, "node": 2, "gres/gpu": 4}
    assert normal.per_job.per_node == {"gres/gpu": 4} and normal.per_job.wall_min == 60
    # 22.05 names a QOS's user by uid, 25.11 as name(uid)
    assert normal.users[ALICE].tres["gres/gpu"] == (2, 1)  # her running job's one GPU
    assert normal.users[ALICE].jobs == (3, 1) and normal.users[ALICE].submit == (10, 2)
    assert normal.accounts["ml"].tres["gres/gpu"] == (6, 2)
    assert mgr.qos["high"].users[BOB].tres["gres/gpu"] == (8, 2)
    alice = mgr.association("ml", "hpcorch-alice")
    assert alice is not None and alice.uid == ALICE
    assert alice.per_job.tres == {"cpu": 12, "mem": 8000, "gres/gpu": 3}
    assert alice.per_job.wall_min == 120 and alice.max_jobs == (2, 1)
    assert alice.max_submit == (6, 2) and alice.grp.tres["gres/gpu"] == (5, 1)
    ml = mgr.account("ml")
    assert ml is not None and ml.parent == "root"
    assert ml.grp.jobs == (5, 2) and ml.grp.tres["gres/gpu"] == (8, 2)
    assert ml.grp.tres["cpu"] == (24, 2)
    assert parts["gpu"].max_nodes == 3 and parts["gpu"].max_time_min == 120
    assert parts["gpu"].max_cpus_per_node == 6 and parts["gpu"].max_mem_per_node_mb == 8000


def test_both_releases_parse_to_the_same_values() -> None:
    (a, pa, _), (b, pb, _) = (load(r) for r in RELEASES)
    assert a.users == b.users and a.qos == b.qos and pa == pb
    key = lambda x: (x.account, x.user)  # noqa: E731
    assert sorted(a.associations, key=key) == sorted(b.associations, key=key)


@pytest.mark.parametrize("release", RELEASES)
def test_the_caps_of_alices_pending_job(release: str) -> None:
    """Job 2 (alice, ml, normal: 2 GPUs, pending QOSMaxGRESPerUser) as a pool job; job 1
    (alice, 1 GPU, running) outside the pool."""
    mgr, parts, jobs = load(release)
    assert jobs[2].reason == "QOSMaxGRESPerUser"
    book = limit_book(mgr, parts, [jobs[2]], now=0.0)
    caps = {c.key: c for c in book.of(2)}
    assert set(caps) == {
        "qos/normal/job", "qos/normal", "qos/normal/user/hpcorch-alice",
        "qos/normal/account/ml", "assoc/7/job", "assoc/7", "assoc/3", "partition/gpu/job",
    }  # fmt: skip
    user = caps["qos/normal/user/hpcorch-alice"]
    assert user.limit == Amounts(gpus=2, jobs=3)
    assert user.outside.gpus == 1 and user.outside.jobs == 1  # job 1
    assert user.submit == 10 and user.submitted == 2
    assert "MaxTRESPerUser" in user.describe() and "gpus=2" in user.describe()
    per_job = caps["qos/normal/job"]
    assert per_job.per_job and per_job.limit == Amounts(gpus=4, nodes=2, cpus=16)
    assert per_job.per_node == Amounts(gpus=4) and per_job.wall_min == 60
    assoc = caps["assoc/7"]
    assert assoc.limit == Amounts(gpus=5, jobs=2) and assoc.submit == 6
    assert caps["assoc/7/job"].limit == Amounts(gpus=3, cpus=12, mem_mb=8000)
    assert caps["assoc/7/job"].wall_min == 120
    account = caps["assoc/3"]
    assert account.limit == Amounts(gpus=8, cpus=24, jobs=5)
    assert account.outside.gpus == 2  # alice's job 1 and bob's job 3 in ml
    part = caps["partition/gpu/job"]
    assert part.limit == Amounts(nodes=3) and part.per_node == Amounts(cpus=6, mem_mb=8000)
    assert part.wall_min == 120
    assert caps["qos/normal"].limit == Amounts(gpus=12, jobs=20)


@pytest.mark.parametrize("release", RELEASES)
def test_a_running_pool_job_is_not_counted_outside(release: str) -> None:
    mgr, parts, jobs = load(release)
    book = limit_book(mgr, parts, [jobs[1], jobs[2]], now=0.0)
    user = book.caps["qos/normal/user/hpcorch-alice"]
    assert user.outside == Amounts(gpus=0, nodes=0, cpus=0, mem_mb=0, jobs=0)
    assert book.caps["assoc/3"].outside.gpus == 1  # bob's job 3 only
    # bob's job 4 under QOS high and physics: his caps, not alice's
    keys = {c.key for c in caps_of_job(mgr, parts, jobs[4])}
    assert "qos/high/user/hpcorch-bob" in keys and "qos/normal/user/hpcorch-alice" not in keys
    # (physics and bob's association in it set no limit)
    assert keys == {"qos/high/user/hpcorch-bob", "partition/gpu/job"}
    # a job that joins after the read gets its caps from the same read
    later = rekey(book, mgr, parts, [jobs[1], jobs[2], jobs[4]])
    assert later.caps["qos/high/user/hpcorch-bob"].outside.gpus == 2
    assert set(later.jobs) == {1, 2, 4}
