"""How the controller's loop runs: its cycle, round and limits (:class:`LoopConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcorch.controller.reconcile import Settings

PARALLEL_ACTIONS = 8
"""Actions at once for a controller on Slurm's commands (each a process of its own)."""


@dataclass(frozen=True)
class LoopConfig:
    interval_s: float = 10.0
    """Seconds between cycles."""
    fast_interval_s: float = 0.25
    """Seconds between cycles while a transition is in flight (a job starting or
    stopping): the controller acts on a checkpoint exit or a start as soon as Slurm shows
    it, not at the next full cycle. These fast cycles observe and move the state machines;
    they read the metrics of jobs in transition only (every job's at least every
    ``interval_s``)."""
    max_calls_per_s: float = 8.0
    """Slurm calls per second the fast cycles may make at most (0: no bound): a cycle
    that made n calls is followed by at least n / max_calls_per_s seconds."""
    fast_for_s: float = 300.0
    """A transition is polled fast for at most this long (a job left pending by Slurm
    for longer is looked at every ``interval_s``)."""
    round_s: float = 60.0
    """Seconds between scheduling rounds (sooner when a job arrives or ends)."""
    measured_round: float = 0.25
    """A job's first report of a launch, or at a batch the controller gave it live, brings
    the next round forward to this fraction of ``round_s`` after the last (0: not
    forward): a new job's batch and GPU count are found in steps about a report apart, not
    a round (a few per launch: :data:`hpcorch.controller.execute.MEASURED_REBATCHES`)."""
    restart_cost_s: float = 30.0
    """What the policy assumes a resize costs a job; a running job also trains at least
    this long (and at least ``settings.min_run_s``) before it is stopped again."""
    stale_after_s: float = 30.0
    """A cycle's actions are carried out only while its observation of the pool is at
    most this old: with a slurmctld that answers slowly, the rest wait for the next cycle,
    planned again from a fresh observation."""
    max_starts_per_cycle: int = 64
    parallel_actions: int = 1
    """Actions of different jobs carried out at once (each job's in order): a cycle's 64
    starts are 64 Slurm calls, which slurmctld answers from several threads. 1: one after
    the other (the simulator's cluster); the controller on Slurm's commands runs
    :data:`PARALLEL_ACTIONS`."""
    max_holds_per_cycle: int = 8
    """User holds turned into the controller's own per cycle (each is one Slurm call): 500
    jobs submitted at once are all held by the controller within 63 cycles, a cycle's Slurm
    calls stay bounded meanwhile."""
    mix_types: bool = False
    """Let one launch span nodes of several GPU types (``controller --mix-gpu-types``);
    else every launch is on one type."""
    settings: Settings = field(default_factory=Settings)
