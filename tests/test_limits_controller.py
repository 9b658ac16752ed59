"""The controller's side of Slurm's limits, pure (hpcorch/controller/limits.py,
learned.py, hpcorch/limits.py, hpcorch/slurm/limit_check.py): pending reasons read, caps
learned from refused launches and unlearned, the policy's limits from what Slurm reports,
starts held while a group's jobs still hold what a start needs, status reasons, and
``hpcorch submit``'s refusal of a job no limit lets run, on the recorded limits of 22.05
and 25.11."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hpcorch.cluster import Shape
from hpcorch.controller.learned import LEARN_TTL_S, Learned, dumps, keep, learn, loads
from hpcorch.controller.limits import (
    LIMIT_WAIT,
    NEVER,
    blocked,
    group_members,
    limit_wait,
    policy_limits,
)
from hpcorch.controller.rows import JobRecord
from hpcorch.limits import Amounts, Cap, LimitBook, refusal
from hpcorch.slurm.assoc_mgr import parse_assoc_mgr, parse_partitions
from hpcorch.slurm.limit_check import job_caps, refusal_of
from hpcorch.slurm.limits import limit_book
from hpcorch.slurm.parse import parse_squeue

FIXTURES = Path(__file__).parent / "fixtures"
USER = "qos/normal/user/alice"


def rec(sid: int, phase: str = "queued", gpus: int = 0, target: int = 0, **kw: object) -> JobRecord:
    r = JobRecord(
        slurm_id=sid, job_key=f"j{sid}", name=f"j{sid}", user="alice", job_dir="/j",
        app="", min_gpus=1, max_gpus=8, batch=64, max_batch=64, max_micro=64,
        submit_time=0.0, phase=phase, phase_since=0.0, gpus=gpus, nodes=1 if gpus else 0,
        target_gpus=target,
    )  # fmt: skip
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def book(user_gpus: int | None = 4, outside: int = 0, read_at: float = 0.0) -> LimitBook:
    caps = {
        USER: Cap(USER, "QOS normal MaxTRESPerUser", limit=Amounts(gpus=user_gpus),
                  outside=Amounts(gpus=outside)),
        "qos/normal/job": Cap("qos/normal/job", "QOS normal MaxTRESPerJob", per_job=True,
                              limit=Amounts(gpus=3)),
    }  # fmt: skip
    return LimitBook(caps, {i: (USER, "qos/normal/job") for i in (1, 2, 3)}, read_at)


def test_pending_reasons() -> None:
    assert refusal("Resources") is None and refusal("Priority") is None
    assert refusal("") is None and refusal("JobHeldAdmin") is None
    assert refusal("ReqNodeNotAvail, UnavailableNodes:n3") is None
    got = {
        r: (w.scope, w.dim)
        for r in (
            "QOSMaxGRESPerUser", "QOSMaxGRESPerJob", "QOSMaxGRESPerAccount", "QOSGrpGRES",
            "QOSMaxJobsPerUserLimit", "QOSGrpJobsLimit", "QOSMaxNodePerJobLimit",
            "QOSMaxWallDurationPerJobLimit", "AssocMaxGRESPerJob", "AssocMaxJobsLimit",
            "AssocGrpGRES", "AssocGrpJobsLimit", "PartitionNodeLimit", "PartitionTimeLimit",
            "AssocGrpGRESRunMinutes", "SomethingNew", "MaxGRESPerAccount",
            "QOSMaxBillingPerJob", "AccountingPolicy",
        )
        if (w := refusal(r)) is not None
    }  # fmt: skip
    assert got == {
        "QOSMaxGRESPerUser": ("user", "gpus"), "QOSMaxGRESPerJob": ("job", "gpus"),
        "QOSMaxGRESPerAccount": ("account", "gpus"), "QOSGrpGRES": ("qos", "gpus"),
        "QOSMaxJobsPerUserLimit": ("user", "jobs"), "QOSGrpJobsLimit": ("qos", "jobs"),
        "QOSMaxNodePerJobLimit": ("job", "nodes"),
        "QOSMaxWallDurationPerJobLimit": ("job", "time"), "AssocMaxGRESPerJob": ("job", "gpus"),
        "AssocMaxJobsLimit": ("user", "jobs"), "AssocGrpGRES": ("account", "gpus"),
        "AssocGrpJobsLimit": ("account", "jobs"), "PartitionNodeLimit": ("job", "nodes"),
        "PartitionTimeLimit": ("job", "time"), "AssocGrpGRESRunMinutes": ("account", "gpus"),
        "SomethingNew": ("unknown", "gpus"), "MaxGRESPerAccount": ("account", "gpus"),
        "QOSMaxBillingPerJob": ("job", "gpus"), "AccountingPolicy": ("unknown", "gpus"),
    }  # fmt: skip
    assert refusal("QOSMinGRES") is None  # below a minimum: a cap below would not help


def test_the_policy_sees_each_jobs_bounds_and_its_groups_room() -> None:
    records = [rec(1), rec(2, "running", gpus=2)]
    lim = policy_limits(records, book(user_gpus=4, outside=1), [])
    assert lim.of("1").max_gpus == 3
    (group,) = lim.groups
    assert group.members == ("1", "2") and group.gpus == 3  # 4 less 1 held outside


def test_a_start_waits_until_the_groups_jobs_give_back_what_it_needs() -> None:
    shrinking = rec(2, "stopping", gpus=4, target=2)
    starting = rec(1, "starting", target=2)
    records = [starting, shrinking]
    why = limit_wait(starting, Shape(1, 2), records, book(user_gpus=4), [])
    assert why.startswith(LIMIT_WAIT) and "MaxTRESPerUser" in why
    relaunching = rec(2, "starting", target=2)  # it stopped: now starting at 2
    assert limit_wait(starting, Shape(1, 2), [starting, relaunching], book(user_gpus=4), []) == ""


def test_status_says_which_limit_holds_a_job_back() -> None:
    never = rec(1, min_gpus=4)
    assert blocked(never, [never], book(), []).startswith(NEVER)
    assert "MaxTRESPerJob" in blocked(never, [never], book(), [])
    full = rec(1, min_gpus=2)
    other = rec(2, "running", gpus=2)
    why = blocked(full, [full, other], book(user_gpus=4, outside=1), [])
    assert why.startswith(LIMIT_WAIT) and "(1 outside the pool)" in why
    assert blocked(full, [full], book(user_gpus=4, outside=1), []) == ""


def test_the_cycles_groups_give_every_queued_job_the_reason_it_had() -> None:
    """The groups computed once a cycle (thousands of queued jobs) say what each job's own
    look at all the records says, a job equal to another in every field included."""
    records = [rec(i, "running", gpus=2) for i in range(1, 4)]
    records += [rec(i, min_gpus=1 + i % 3) for i in range(4, 12)] + [rec(4, min_gpus=2)]
    records[-1].job_key = records[3].job_key = "same"  # equal records, not the same one
    for b in (book(), book(user_gpus=4, outside=1), book(user_gpus=8), book(user_gpus=1)):
        active = [r for r in records if r.active]
        groups = group_members(active, b)
        for r in records[3:]:
            assert blocked(r, active, b, [], groups) == blocked(r, records, b, [])


def test_a_refused_launch_teaches_a_cap_below_it() -> None:
    r = rec(1, "starting", target=3)
    other = rec(2, "running", gpus=2)
    why = refusal("QOSMaxGRESPerUser")
    assert why is not None
    # the limits read know alice's group: one GPU less than was refused, on top of hers
    cap = learn(r, Shape(1, 3), why, [r, other], book(user_gpus=8), 50.0)
    assert (cap.key, cap.dim, cap.value, cap.basis) == (USER, "gpus", 4, 8)
    # they do not: half of what was refused, on the user's jobs
    cap = learn(r, Shape(1, 3), why, [r, other], LimitBook(), 50.0)
    assert (cap.key, cap.dim, cap.value) == ("user/alice", "gpus", 3)
    unknown = refusal("SomethingNew")
    assert unknown is not None
    cap = learn(r, Shape(2, 4), unknown, [r], LimitBook(), 50.0)
    assert (cap.key, cap.dim, cap.value) == ("job/1", "gpus", 4)
    jobs = refusal("QOSMaxJobsPerUserLimit")
    assert jobs is not None
    cap = learn(r, Shape(1, 3), jobs, [r, other], LimitBook(), 50.0)
    assert (cap.dim, cap.value) == ("jobs", 1)
    lim = policy_limits([r, other], LimitBook(), [cap])
    assert lim.groups[0].jobs == 1 and lim.groups[0].members == ("1", "2")


def test_a_learned_cap_is_unlearned_when_slurm_shows_more_room_or_it_expires() -> None:
    r = rec(1, "queued")
    cap = Learned(USER, "gpus", 2, "QOSMaxGRESPerUser", 100.0, 1, "alice", basis=4)
    assert keep(cap, [r], book(user_gpus=4, read_at=50.0), 200.0)  # not read since
    assert keep(cap, [r], book(user_gpus=4, read_at=150.0), 200.0)  # the same room
    assert not keep(cap, [r], book(user_gpus=6, read_at=150.0), 200.0)  # raised
    assert not keep(cap, [r], book(user_gpus=4, outside=2, read_at=150.0), 200.0)  # explained
    assert not keep(cap, [r], book(read_at=50.0), 100.0 + LEARN_TTL_S + 1)  # expired
    assert not keep(cap, [], book(read_at=50.0), 200.0)  # the job is gone
    assert loads(dumps([cap])) == [cap] and loads("not json") == [] and loads(None) == []


def _alice(release: str) -> list[Cap]:
    d = FIXTURES / f"slurm-{release}"
    mgr = parse_assoc_mgr((d / "assoc_mgr.txt").read_text())
    parts = parse_partitions((d / "partitions.txt").read_text())
    return job_caps(mgr, parts, "hpcorch-alice", 1001, None, None, "gpu")


@pytest.mark.parametrize("release", ["22.05", "25.11"])
def test_submit_refuses_a_minimum_no_limit_allows(release: str) -> None:
    caps = _alice(release)
    assert refusal_of(caps, 2, 4, 1) == ""  # alice's own default account ml, QOS normal
    why = refusal_of(caps, 3, 4, 1)  # her 2 GPUs under QOS normal, whatever else she runs
    assert "MaxTRESPerUser" in why and "allows 2 GPUs for its jobs together" in why
    # 6 CPUs a node (the partition's MaxCPUsPerNode) at 4 per GPU: 1 GPU a node, and
    # QOS normal allows 2 nodes a job
    assert refusal_of(caps, 2, 4, 4) == ""
    assert "needs 3 nodes" in refusal_of([c for c in caps if "user" not in c.key], 3, 4, 4)


@pytest.mark.parametrize("release", ["22.05", "25.11"])
def test_the_recorded_pending_job_is_within_the_book_but_its_users_cap(release: str) -> None:
    """Job 2 of the recording (2 GPUs, pending QOSMaxGRESPerUser) as the pool's: the
    policy may give it 1 GPU (2 less job 1's, outside the pool)."""
    d = FIXTURES / f"slurm-{release}"
    mgr = parse_assoc_mgr((d / "assoc_mgr.txt").read_text())
    parts = parse_partitions((d / "partitions.txt").read_text())
    jobs = {j.job_id: j for j in parse_squeue(json.loads((d / "limits-squeue.json").read_text()))}
    b = limit_book(mgr, parts, [jobs[2]], 0.0)
    lim = policy_limits([rec(2, user="hpcorch-alice")], b, [])
    gpus = [g.gpus for g in lim.groups if g.gpus is not None]
    assert min(gpus) == 1  # QOS normal MaxTRESPerUser 2, 1 held by job 1 outside
    assert lim.of("2").max_gpus == 3 and lim.of("2").max_nodes == 2
    assert 2 not in b.time_limits  # its --time=30 is within MaxWall 60 and MaxTime 120
    jobs[2] = replace(jobs[2], time_limit_min=0)  # no time limit of its own: the tightest
    assert limit_book(mgr, parts, [jobs[2]], 0.0).time_limits == {2: 60}
