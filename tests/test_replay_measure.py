"""The real pool's planned-launch waits, as the benchmarks measure them."""

from __future__ import annotations

import pytest

from benchmarks.replay_measure import planned_waits


def _start(jid: int, decided: float, stored: float) -> dict[str, object]:
    return {
        "slurm_id": jid, "action": "start", "status": "done", "time": decided, "done_at": stored,
    }  # fmt: skip


def test_a_launch_that_ran_before_its_decision_was_stored_did_not_wait() -> None:
    """A cycle's decisions are stored after all its Slurm calls: a short job released
    early in a cycle of 30 s of calls can start and end before its decision is stored.
    It waited 0 s, not until the run's end."""
    decisions = [_start(7, decided=100.0, stored=130.0)]
    assert planned_waits(decisions, {7: [104.0, 105.0]}, end=2000.0) == [(0.0, 7)]


def test_a_launch_never_seen_running_waits_to_the_next_decision() -> None:
    decisions = [
        _start(7, decided=100.0, stored=101.0),
        {"slurm_id": 7, "action": "hold", "status": "done", "time": 250.0, "done_at": 251.0},
    ]
    assert planned_waits(decisions, {7: [50.0]}, end=2000.0) == [(150.0, 7)]
    assert planned_waits(decisions, {7: [160.0]}, end=2000.0) == [(59.0, 7)]


def test_the_seconds_slurmctld_was_stopped_are_not_a_planned_wait() -> None:
    """Released 0.5 s before a 120 s SIGSTOP and running 1.2 s after it (as three ncf jobs
    in the 22.05 site run): 121.7 s pending, 1.7 s of it while slurmctld could act."""
    decisions = [_start(7, decided=99.5, stored=99.5)]
    stops = [(100.0, 220.0)]
    [(w, _)] = planned_waits(decisions, {7: [221.2]}, end=2000.0)
    assert w == pytest.approx(121.7)
    [(w, _)] = planned_waits(decisions, {7: [221.2]}, end=2000.0, paused=stops)
    assert w == pytest.approx(1.7)
    # a stop after the launch ran, or a wait wholly inside a stop
    assert planned_waits(decisions, {7: [150.0]}, end=2000.0, paused=[(300.0, 400.0)]) == [
        (50.5, 7)
    ]
    [(w, _)] = planned_waits(
        [_start(8, decided=110.0, stored=110.0)], {8: [200.0]}, end=2000.0, paused=stops
    )
    assert w == 0.0
