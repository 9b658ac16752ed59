"""The key jobs are pooled by: owner and --app, else the runtime's fingerprint, else none."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.controller.identity import fingerprint, model_bytes, model_key
from hpcorch.controller.loop import Controller
from hpcorch.controller.store import Store
from hpcorch.policy.share import SharePolicy
from hpcorch.policy.types import Plan, Snapshot
from tests.test_controller_logic import CFG, FakeCluster


def test_keys_follow_owner_and_app_then_fingerprint() -> None:
    fp = fingerprint("ResNet", 11_173_962, 50_000)
    assert fp == "ResNet:11173962:50000"
    assert model_key("alice", "train", fp, 7) == "alice/train"
    assert model_key("bob", "train", fp, 8) == "bob/train"  # two users' train: two keys
    # the same model of two users: two keys (pooled only where the site opts in)
    assert model_key("alice", "", fp, 7) == f"alice/model:{fp}"
    assert model_key("bob", "", fp, 8) == f"bob/model:{fp}"
    assert model_key("alice", "", "", 7) == "job:7"  # says nothing: never pooled


def test_reported_values_are_bounded() -> None:
    assert fingerprint("Res/Net\n;rm -rf", 10, 10) == "ResNetrm-rf:10:10"
    assert fingerprint("x" * 500, 10, 10).startswith("x" * 64 + ":")
    for bad in (None, "", 5):
        assert fingerprint(bad, 10, 10) == ""
    for bad_n in (0, -3, 1.5, True, "12", 10**20):
        assert fingerprint("Net", bad_n, 10) == ""
        assert model_bytes(bad_n) == 0
    assert model_bytes(4_000) == 4_000


@dataclass
class Reporting(FakeCluster):
    """Jobs report a start event (model fingerprint and size) once they run."""

    lines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def read_metrics(
        self, job_dir: str, offset: int, uid: int = -1
    ) -> tuple[Sequence[dict[str, Any]], int]:
        got = self.lines.get(job_dir, [])
        return got[offset:], len(got)


class Recorder:
    name = "share"

    def __init__(self) -> None:
        self.inner = SharePolicy()
        self.seen: dict[str, tuple[str, int]] = {}

    def schedule(self, snapshot: Snapshot) -> Plan:
        for j in snapshot.jobs:
            self.seen[j.job_id] = (j.application, j.model_bytes)
        return self.inner.schedule(snapshot)


def test_the_controller_keys_jobs_by_owner_app_and_fingerprint(tmp_path: Path) -> None:
    cluster = Reporting(nodes=4)
    start = {"event": "start", "epochs": 3, "dataset_size": 1000, "model": "Net",
             "params": 250, "model_bytes": 1000}  # fmt: skip
    for sid, user, app in ((1, "alice", "train"), (2, "bob", "train"), (3, "alice", ""),
                           (4, "bob", ""), (5, "carol", "")):  # fmt: skip
        cluster.add(sid, 1, 4)
        tags = dict(cluster.jobs[sid].job.tags)
        if app:
            tags["app"] = app
        cluster.set(sid, user=user, name="train", tags=tags)
        if sid != 5:  # job 5's script does not use the runtime: it reports nothing
            cluster.lines[f"/jobs/{sid}"] = [start]
    policy = Recorder()
    ctl = Controller(cluster, Store(tmp_path / "s.db"), policy, CFG, log=lambda m: None)
    for _ in range(4):
        ctl.cycle()
        cluster.t += 1
    fp = "model:Net:250:1000"
    assert policy.seen == {
        "1": ("alice/train", 1000),
        "2": ("bob/train", 1000),
        "3": (f"alice/{fp}", 1000),
        "4": (f"bob/{fp}", 1000),
        "5": ("job:5", 0),
    }


def test_a_hostile_start_event_neither_keys_nor_stops_the_loop(tmp_path: Path) -> None:
    """A job's script writes its start event: model fields of every wrong kind leave its
    key at ``job:<id>`` and its size at 0, and the job beside it is keyed as usual."""
    cluster = Reporting(nodes=4)
    bad = {"event": "start", "epochs": 3, "dataset_size": 1000, "model": {"x": 1},
           "params": float("nan"), "model_bytes": -(10**30)}  # fmt: skip
    good = {"event": "start", "epochs": 3, "dataset_size": 1000, "model": "Net",
            "params": 250, "model_bytes": 1000}  # fmt: skip
    for sid, line in ((1, bad), (2, good), (3, {**good, "model": "../" * 400})):
        cluster.add(sid, 1, 4)
        cluster.set(sid, user="u", name="train", tags=dict(cluster.jobs[sid].job.tags))
        cluster.lines[f"/jobs/{sid}"] = [line]
    policy = Recorder()
    ctl = Controller(cluster, Store(tmp_path / "s.db"), policy, CFG, log=lambda m: None)
    for _ in range(4):
        ctl.cycle()
        cluster.t += 1
    assert policy.seen["1"] == ("job:1", 0)
    assert policy.seen["2"] == ("u/model:Net:250:1000", 1000)
    assert policy.seen["3"] == ("u/model:" + "." * 64 + ":250:1000", 1000)
