"""Information regimes: what a policy knows of a job before it runs, in both engines."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.policy import make_policy
from hpcorch.policy.types import CompletedJob, JobView, Plan, Policy, Snapshot
from hpcorch.sim.config import SimConfig
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.loop import SimResult, simulate
from hpcorch.sim.regime import Regime, regime_view
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

Engine = Callable[..., SimResult]


def _view(job_id: str, app: str, epochs: int = 10) -> JobView:
    return JobView(job_id, app, 0.0, 1, 32, 1, 4, 32, 256, 1, 64, epochs, 100.0)


def _snapshot() -> Snapshot:
    jobs = tuple(_view(f"j{i}", "cifar10") for i in range(4))
    history = (CompletedJob("old", "cifar10", 100.0, 400.0, 10.0, 10),)
    return Snapshot(now=0.0, node_gpus=(4,), jobs=jobs, history=history)


def test_cold_makes_every_job_its_own_application_and_hides_history() -> None:
    snap = _snapshot()
    order = {j.job_id: i for i, j in enumerate(snap.jobs)} | {"old": 9}
    cold = regime_view(snap, Regime("cold"), order)
    assert len({j.application for j in cold.jobs}) == 4
    assert "cifar10" not in {j.application for j in cold.jobs}
    assert cold.history == ()
    assert regime_view(snap, Regime("known"), order) is snap


def test_mixed_keeps_every_other_job_known() -> None:
    snap = _snapshot()
    order = {j.job_id: i for i, j in enumerate(snap.jobs)} | {"old": 4}
    mixed = regime_view(snap, Regime("mixed"), order)
    assert [j.application == "cifar10" for j in mixed.jobs] == [True, False, True, False]
    assert [h.job_id for h in mixed.history] == ["old"]  # arrived 5th: known


def test_declared_epochs_scale_what_the_policy_sees() -> None:
    snap = _snapshot()
    half = regime_view(snap, Regime("known", epochs=0.5), {})
    assert {j.max_epochs for j in half.jobs} == {5}
    assert {j.application for j in half.jobs} == {"cifar10"}
    with pytest.raises(ValueError, match="unknown regime"):
        Regime("warm")


class _Recorder:
    """fifo that remembers what it was shown."""

    def __init__(self) -> None:
        self.inner: Policy = make_policy("fifo")
        self.name = "fifo"
        self.apps: list[tuple[int, set[str]]] = []
        self.history: list[int] = []

    def schedule(self, snapshot: Snapshot) -> Plan:
        self.apps.append((len(snapshot.jobs), {j.application for j in snapshot.jobs}))
        self.history.append(len(snapshot.history))
        return self.inner.schedule(snapshot)


JOBS = [WorkloadJob(f"ncf-{i}", 10.0 + 400.0 * i, "ncf", 1, 256) for i in range(3)] + [
    WorkloadJob("ncf-3", 1300.0, "ncf", 1, 256),
    WorkloadJob("ncf-4", 1310.0, "ncf", 1, 256),
]


@pytest.mark.parametrize("engine", [simulate, simulate_controlled], ids=["direct", "controller"])
def test_engines_show_the_same_regime(apps: dict[str, AppTrace], engine: Engine) -> None:
    known, cold = _Recorder(), _Recorder()
    engine(JOBS, known, apps, SimConfig(nodes=1))
    engine(JOBS, cold, apps, SimConfig(nodes=1, regime=Regime("cold")))
    assert max(known.history) >= 2  # earlier ncf jobs had finished
    assert max(cold.history) == 0
    # two jobs at once: one application when known, two when new
    assert [len(a) for n, a in known.apps if n > 1] == [1] * sum(n > 1 for n, _ in known.apps)
    assert [len(a) for n, a in cold.apps if n > 1] == [n for n, _ in cold.apps if n > 1]
    assert any(n > 1 for n, _ in cold.apps)


def test_cli_regime_in_json(small_workload: Path) -> None:
    res = CliRunner().invoke(
        main, ["simulate", str(small_workload), "--policy", "fifo", "--regime", "cold", "--json"]
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [r["regime"] for r in doc["results"]] == ["cold"]
    bad = CliRunner().invoke(main, ["simulate", str(small_workload), "--regime", "warm"])
    assert bad.exit_code != 0 and "warm" in bad.stderr


def test_no_length_shows_the_controllers_placeholders() -> None:
    snap = _snapshot()
    snap = replace(snap, jobs=tuple(replace(j, epoch=3, progress=350.0) for j in snap.jobs))
    order = {j.job_id: i for i, j in enumerate(snap.jobs)} | {"old": 9}
    none = regime_view(snap, Regime.named("no-length"), order)
    assert {(j.max_epochs, j.progress_per_epoch_hint, j.length_known) for j in none.jobs} == {
        (4, 1.0, False)
    }
    assert none.history == ()  # and it is cold: every job new
    assert len({j.application for j in none.jobs}) == 4
    half = regime_view(snap, Regime.named("half-length"), order)
    assert [j.length_known for j in half.jobs] == [True, False, True, False]
    assert [j.max_epochs for j in half.jobs] == [10, 4, 10, 4]
    known = regime_view(snap, Regime("known", lengths="none"), order)
    assert {j.application for j in known.jobs} == {"cifar10"}  # pooled, lengths hidden
    assert known.history == snap.history
    assert not any(j.length_known for j in known.jobs)
    assert Regime.named("no-length").name == "no-length"
    assert Regime("known", lengths="half").name == "known, half lengths"
    with pytest.raises(ValueError, match="unknown lengths"):
        Regime("cold", lengths="some")


class _Lengths:
    """fifo that remembers which jobs it was told the length of when it first saw them."""

    def __init__(self) -> None:
        self.inner: Policy = make_policy("fifo")
        self.name = "fifo"
        self.seen: dict[str, tuple[bool, int]] = {}

    def schedule(self, snapshot: Snapshot) -> Plan:
        for j in snapshot.jobs:
            self.seen.setdefault(j.job_id, (j.length_known, j.max_epochs))
        return self.inner.schedule(snapshot)


@pytest.mark.parametrize("engine", [simulate, simulate_controlled], ids=["direct", "controller"])
def test_engines_hide_the_same_lengths(apps: dict[str, AppTrace], engine: Engine) -> None:
    """Through the controller the simulated jobs submit and report no length (the
    controller makes its placeholders); the direct loop shows the same placeholders."""
    told = _Lengths()
    engine(JOBS, told, apps, SimConfig(nodes=1, regime=Regime.named("half-length")))
    by_arrival = [told.seen[k] for k in sorted(told.seen, key=lambda k: (len(k), k))]
    assert [known for known, _ in by_arrival] == [True, False, True, False, True]
    epochs = apps["ncf"].epochs
    assert all(e == epochs for known, e in by_arrival if known)
    assert all(e == 1 for known, e in by_arrival if not known)  # its first epoch + 1


def test_cli_no_length_regime(small_workload: Path) -> None:
    res = CliRunner().invoke(
        main,
        ["simulate", str(small_workload), "--policy", "fifo", "--regime", "no-length", "--json"],
    )
    assert res.exit_code == 0, res.stderr
    assert [r["regime"] for r in json.loads(res.stdout)["results"]] == ["no-length"]
    mix = CliRunner().invoke(
        main,
        ["simulate", str(small_workload), "--policy", "fifo", "--lengths", "half", "--json"],
    )
    assert mix.exit_code == 0, mix.stderr
    assert [r["regime"] for r in json.loads(mix.stdout)["results"]] == ["known, half lengths"]
    bad = CliRunner().invoke(main, ["simulate", str(small_workload), "--lengths", "most"])
    assert bad.exit_code != 0 and "most" in bad.stderr
