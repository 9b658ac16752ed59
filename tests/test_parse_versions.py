"""The same cluster as Slurm 22.05, 23.11, 24.11 and 25.11 print it, each recorded from a
real daemon by tests/fixtures/record (see tests/fixtures/README.md): every release parses
to the same jobs and nodes in everything but the moment of recording, and to times that
tell the same story."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.parse import SlurmJob, SlurmNode, parse_nodes, parse_squeue
from hpcorch.slurm.squeue_cache import SIGNATURE_ARGV
from tests.squeue_text import signatures

FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = ["22.05", "23.11", "24.11", "25.11"]
PARSERS = {"22.05": "v0.0.38", "23.11": "v0.0.40", "24.11": "v0.0.42", "25.11": "v0.0.44"}


def load(version: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"slurm-{version}" / name).read_text())
    return doc


def timeless(jobs: Sequence[SlurmJob]) -> list[SlurmJob]:
    """The jobs by id, their times (the moment of recording) zeroed."""
    return [
        dataclasses.replace(j, submit_time=0, start_time=0, end_time=0)
        for j in sorted(jobs, key=lambda j: j.job_id)
    ]


def job(job_id: int, **kw: Any) -> SlurmJob:
    base: dict[str, Any] = dict(
        job_id=job_id,
        name="hpcorch",
        user="root",
        state="FAILED",
        reason="NonZeroExitCode",
        partition="gpu",
        nodes="n1",
        node_count=1,
        gpus_per_node=2,
        comment="",
        submit_time=0,
        start_time=0,
        end_time=0,
        time_limit_min=525600,
        restarts=0,
        exit_code=0,
        work_dir="/tmp",
        reservation="",
        held=False,
        uid=0,
        cpus=1,
    )
    base.update(kw)
    return SlurmJob(**base)


# tests/fixtures/record's six jobs, times zeroed (test_times_tell_the_recorded_story)
EXPECTED_JOBS = [
    job(1, exit_code=1),
    job(2, state="COMPLETED", reason="None"),
    job(3, nodes="n[1-2]", node_count=2, exit_code=75, cpus=2),
    job(
        4,
        name="my job",
        state="RUNNING",
        reason="None",
        comment="hpcorch:test",
        gpus_by_node=(2,),
    ),
    *(
        job(
            i,
            name="wrap",
            state="PENDING",
            reason=reason,
            nodes="",
            node_count=4,
            gpus_per_node=4,
            time_limit_min=0,
            held=held,
            cpus=4,
        )
        for i, reason, held in ((5, "Resources", False), (6, "JobHeldUser", True))
    ),
]

EXPECTED_NODES = [
    SlurmNode(
        name=f"n{i}",
        address="127.0.0.1",
        states=("MIXED",) if i == 1 else ("IDLE",),
        partitions=("gpu",),
        cpus=8,
        gpus=4,
        gpus_used=2 if i == 1 else 0,
        reason="",
        cpus_used=1 if i == 1 else 0,
    )
    for i in range(1, 5)
]


def node_file(version: str) -> str:
    return "sinfo.json" if version == "22.05" else "scontrol-nodes.json"


def test_every_recorded_release_is_tested() -> None:
    recorded = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    assert recorded == [f"slurm-{v}" for v in VERSIONS]


@pytest.mark.parametrize("version", VERSIONS)
def test_fixture_is_the_version_it_claims(version: str) -> None:
    names = ["squeue.json", "sinfo.json"] + ([] if version == "22.05" else ["scontrol-nodes.json"])
    for name in names:
        doc = load(version, name)
        assert not doc.get("errors"), (name, doc["errors"])
        meta = doc["meta"]
        plugin = meta["plugin"]
        parser = plugin.get("data_parser") or plugin.get("type", "")
        assert parser.endswith(PARSERS[version]), (name, plugin)
        release = (meta.get("slurm") or meta.get("Slurm"))["release"]
        assert release.startswith(version + "."), (name, release)


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_parses_to_the_same_jobs(version: str) -> None:
    assert timeless(parse_squeue(load(version, "squeue.json"))) == EXPECTED_JOBS


@pytest.mark.parametrize("version", VERSIONS)
def test_times_tell_the_recorded_story(version: str) -> None:
    """The times are the recording's own: not equal across releases, but each file's must
    be those of record's jobs, submitted one after another ended."""
    jobs = {j.job_id: j for j in parse_squeue(load(version, "squeue.json"))}
    submits = [jobs[i].submit_time for i in range(1, 7)]
    assert submits == sorted(submits)
    assert submits[0] > 1_600_000_000 and submits[-1] - submits[0] < 600
    for i in (1, 2, 3):  # ended; the next one submitted after it ended
        ended = jobs[i]
        assert ended.submit_time <= ended.start_time <= ended.end_time, ended
        assert jobs[i + 1].submit_time >= ended.end_time
    running = jobs[4]
    assert running.submit_time <= running.start_time <= running.submit_time + 60
    assert running.end_time == running.start_time + 60 * running.time_limit_min
    # an estimate once the backfill scheduler made one: when job 4's time limit ends
    pending = jobs[5]
    assert pending.start_time in (0, running.end_time)
    assert pending.end_time == 0 or pending.end_time > pending.start_time
    held = jobs[6]
    assert held.start_time == held.end_time == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_nodes_parse_to_the_same_nodes(version: str) -> None:
    """22.05's sinfo lists nodes; from 23.02 sinfo groups them and the node list comes
    from ``scontrol show nodes --json``."""
    assert parse_nodes(load(version, node_file(version))) == EXPECTED_NODES
    if version != "22.05":
        assert parse_nodes(load(version, "sinfo.json")) == []


class RecordedSlurm(SlurmCLI):
    """SlurmCLI answering from a version's fixtures instead of running commands."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.version = version
        self.argv: list[list[str]] = []

    def run(self, argv: Sequence[str], stdin: str | None = None) -> str:
        self.calls += 1
        self.argv.append(list(argv))
        here = FIXTURES / f"slurm-{self.version}"
        if list(argv) == SIGNATURE_ARGV:  # the text of the same jobs
            return signatures(json.loads((here / "squeue.json").read_text()))
        argv = [a for a in argv if not a.startswith("--jobs=")]  # (answered with all, as 22.05)
        name = {
            ("squeue", "--json", "--states=all"): "squeue.json",
            ("sinfo", "--json"): "sinfo.json",
            ("scontrol", "show", "nodes", "--json"): "scontrol-nodes.json",
        }[tuple(argv)]
        return (here / name).read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_cli_backend_reads_every_version(version: str) -> None:
    slurm = RecordedSlurm(version)
    assert timeless(slurm.jobs()) == EXPECTED_JOBS
    assert slurm.jobs("pool") == []  # none of them in a reservation: none parsed
    slurm.uid = 0  # the jobs root owns: read, as lease jobs might be, and none of them is
    assert slurm.jobs("pool") == []
    doc = load(version, "squeue.json")
    (raw,) = [j for j in doc["jobs"] if j["job_id"] == 4]
    raw["resv_name"] = "pool"
    assert [j.job_id for j in parse_squeue(doc, "pool")] == [4]
    assert slurm.nodes() == EXPECTED_NODES
    assert slurm.nodes() == EXPECTED_NODES
    node_calls = [a for a in slurm.argv if a[0] != "squeue"]
    if version == "22.05":
        assert node_calls == [["sinfo", "--json"]] * 2
    else:  # falls back once, then asks scontrol directly
        assert node_calls == [
            ["sinfo", "--json"],
            ["scontrol", "show", "nodes", "--json"],
            ["scontrol", "show", "nodes", "--json"],
        ]


def test_squeue_23_02_shapes() -> None:
    """23.02 (v0.0.39) wraps numbers, the wait(2)-status exit code included, keeps plain
    state strings and adds ``hold``."""
    n = lambda v: {"set": True, "infinite": False, "number": v}  # noqa: E731
    raw = {
        "job_id": 7,
        "job_state": "PENDING",
        "state_reason": "JobHeldUser",
        "hold": True,
        "priority": n(0),
        "node_count": n(2),
        "tres_per_node": "gres:gpu:4",
        "exit_code": n(75 << 8),
        "time_limit": n(60),
    }
    (held,) = parse_squeue({"jobs": [raw]})
    assert held.held and held.exit_code == 75 and held.gpus == 8 and held.time_limit_min == 60
    failed = dict(raw, job_state="FAILED", hold=False, exit_code=n(9))
    (job9,) = parse_squeue({"jobs": [failed]})
    assert job9.exit_code == 137 and not job9.held


def test_hold_flag_of_24_05_wins_over_priority() -> None:
    pending = {"job_id": 8, "job_state": ["PENDING"], "priority": {"set": True, "number": 0}}
    (held,) = parse_squeue({"jobs": [dict(pending, hold=True)]})
    (free,) = parse_squeue({"jobs": [dict(pending, hold=False)]})
    (old,) = parse_squeue({"jobs": [pending]})  # no flag: priority 0 means held
    assert held.held and not free.held and old.held
