"""The real pool's planned-launch waits, as the benchmarks measure them."""

from __future__ import annotations

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
