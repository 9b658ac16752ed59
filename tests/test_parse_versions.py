"""The same cluster as Slurm 22.05 (recorded), 23.11 and 24.05 (constructed, see
tests/fixtures/README.md) print it: every version parses to the same jobs and nodes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.parse import SlurmJob, SlurmNode, parse_nodes, parse_squeue

FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = ["22.05", "23.11", "24.05"]
PARSERS = {"22.05": "v0.0.38", "23.11": "v0.0.40", "24.05": "v0.0.41"}


def load(version: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"slurm-{version}" / name).read_text())
    return doc


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
        work_dir="/tmp/t1",
        reservation="",
        held=False,
        uid=0,
    )
    base.update(kw)
    return SlurmJob(**base)


EXPECTED_JOBS = [
    job(1, exit_code=1, submit_time=1795298806, start_time=1795298806, end_time=1795298806),
    job(
        2,
        state="COMPLETED",
        reason="None",
        submit_time=1795298837,
        start_time=1795298837,
        end_time=1795298844,
    ),
    job(
        3,
        nodes="n[1-2]",
        node_count=2,
        exit_code=75,
        submit_time=1795298847,
        start_time=1795298848,
        end_time=1795298850,
    ),
    job(
        4,
        name="my job",
        state="RUNNING",
        reason="None",
        comment="hpcorch:test",
        submit_time=1795298857,
        start_time=1795298857,
        end_time=1826834857,
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
            submit_time=1795298857,
            start_time=1826834857,
            end_time=6121802093,
            time_limit_min=0,
        )
        for i, reason in ((5, "Resources"), (6, "Priority"))
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


@pytest.mark.parametrize("version", VERSIONS)
def test_fixture_is_the_version_it_claims(version: str) -> None:
    for name in ("squeue.json", "sinfo.json"):
        meta = load(version, name)["meta"]
        plugin = meta["plugin"]
        parser = plugin.get("data_parser") or plugin.get("type", "")
        assert parser.endswith(PARSERS[version]), (name, plugin)
        release = (meta.get("slurm") or meta.get("Slurm"))["release"]
        assert release.startswith(version + "."), (name, release)


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_parses_to_the_same_jobs(version: str) -> None:
    assert parse_squeue(load(version, "squeue.json")) == EXPECTED_JOBS


@pytest.mark.parametrize("version", VERSIONS)
def test_nodes_parse_to_the_same_nodes(version: str) -> None:
    """22.05's sinfo lists nodes; from 23.11 sinfo groups them and the node list comes
    from ``scontrol show nodes --json``."""
    name = "sinfo.json" if version == "22.05" else "scontrol-nodes.json"
    assert parse_nodes(load(version, name)) == EXPECTED_NODES
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
        name = {
            ("squeue", "--json", "--states=all"): "squeue.json",
            ("sinfo", "--json"): "sinfo.json",
            ("scontrol", "show", "nodes", "--json"): "scontrol-nodes.json",
        }[tuple(argv)]
        return (FIXTURES / f"slurm-{self.version}" / name).read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_cli_backend_reads_every_version(version: str) -> None:
    slurm = RecordedSlurm(version)
    assert slurm.jobs() == EXPECTED_JOBS
    assert slurm.jobs("pool") == []  # none of them in a reservation: none parsed
    doc = load(version, "squeue.json")
    doc["jobs"][3]["resv_name"] = "pool"
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
