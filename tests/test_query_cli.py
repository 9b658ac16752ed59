"""The user commands through the controller's query socket render what the database
gives them with the same code: describe from the socket is describe from the database;
another user's job is its public part, and says who may see the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import describe as describe_cli
from hpcorch.cli import report as report_cli
from hpcorch.controller.query import Reader, Request, Viewer, answer
from hpcorch.controller.query_server import QueryServer
from hpcorch.controller.store import Sample, Store
from tests.test_query import T0, job


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "ctl"
    store = Store(d / "state.db", clock=lambda: T0 + 15)
    store.put_jobs([job(11, "alice", 1001), job(12, "bob", 1002)])
    store.finish_decision(store.add_decision(11, "start", 0, 2, 64, "start on n1"))
    store.add_samples([Sample(11, T0 + 20, 2, 1, 32, 1, 64, 0.5, 120.0, 1.5)])
    store.close()
    return d


def run(*args: str) -> str:
    res = CliRunner().invoke(describe_cli.describe, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_describe_reads_the_same_from_the_socket_as_from_the_database(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(describe_cli, "slurm_view", lambda _: "RUNNING, user alice")
    from_db = run("11", "--state-dir", str(state))
    assert "directory /home/alice/.hpcorch/jobs/k11" in from_db and "start on n1" in from_db
    srv = QueryServer(state)
    assert srv.start()
    try:
        monkeypatch.setattr(describe_cli, "access", lambda _: "socket")
        from_socket = run("11", "--state-dir", str(state))
        monkeypatch.setattr(report_cli, "access", lambda _: "socket")
        rep_socket = CliRunner().invoke(report_cli.report, ["--state-dir", str(state)])
    finally:
        srv.close()
    assert from_socket == from_db
    monkeypatch.undo()
    rep_db = CliRunner().invoke(report_cli.report, ["--state-dir", str(state)])
    assert rep_socket.exit_code == 0 and rep_socket.output == rep_db.output
    assert rep_db.output.splitlines()[1].split()[:2] == ["11", "alice-job"]


def test_another_users_job_is_its_public_part(state: Path) -> None:
    store = Store(state / "state.db", readonly=True)
    reply = answer(Request("describe", 12), Viewer(1001, "alice", False), Reader(store, 0))
    detail = describe_cli.detail_from_reply(reply)
    assert detail is not None and not detail.full
    assert describe_cli.render(detail, "RUNNING, user bob, nodes n1") == [
        "job 12 (bob-job) of bob: running",
        "  Slurm: RUNNING, user bob, nodes n1",
        "  GPUs 2 (range 1-4), launches 1, resizes 0, GPU time 2:00:00",
        "  its directory, plans, decisions and throughput are visible to bob and the admins only",
    ]


def test_describe_json_is_the_text_as_data(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own job in full (record, decisions, throughput); another user's job only
    what the text shows of it."""
    import json

    monkeypatch.setattr(describe_cli, "slurm_view", lambda _: "RUNNING, user alice")
    doc = json.loads(run("11", "--state-dir", str(state), "--json"))
    assert doc["version"] == 1 and doc["full"] and doc["slurm"] == "RUNNING, user alice"
    assert doc["job"]["job_dir"] == "/home/alice/.hpcorch/jobs/k11"
    assert [d["detail"] for d in doc["decisions"]] == ["start on n1"]
    assert doc["throughput"] == [{"gpus": 2, "samples_per_s": 120.0, "reports": 1}]
    store = Store(state / "state.db", readonly=True)
    reply = answer(Request("describe", 12), Viewer(1001, "alice", False), Reader(store, 0))
    detail = describe_cli.detail_from_reply(reply)
    assert detail is not None
    other = describe_cli.document(detail, "RUNNING, user bob")
    assert "job_dir" not in other["job"] and other["decisions"] == []
    assert other["job"]["user"] == "bob" and other["job"]["launches"] == 1
