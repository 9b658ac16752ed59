"""The controller as a long-running service: its cycles until it is told to stop, Slurm's
outages and slow spells said once each, a failed cycle retried after a back-off, a full
state directory said once, and the pool's lease (hpcorch/controller/lease.py) lost or
held. ``hpcorch controller`` runs :func:`serve`.

When slurmctld does not answer (stopped, restarting, unreachable: ``SlurmUnavailable``)
the controller acts on nothing and asks it every ``interval_s`` with one cheap request
(``scontrol ping``), never with the cycle's heavy queries, so that a slurmctld that comes
back finds no pile of them queued; and at most every quarter of the lease's time to live,
so that the first renewal after the outage comes before a standby could take the pool
over. Once it answers, the clocks of the transitions under way move on by the outage
(:meth:`Controller.excuse`), and the next cycle observes afresh before it acts: a start
or stop that Slurm may have carried out without answering is read from what Slurm shows
(hpcorch/controller/loop.py). An outage is said when it begins and when it ends; so is a
spell of slow answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpcorch.controller.lease import LeaseLost
from hpcorch.controller.logs import describe, disk_full
from hpcorch.controller.loop import Controller
from hpcorch.errors import SlurmTimeout, SlurmUnavailable

SLOW_CALL_S = 3.0
"""A cycle whose Slurm calls took this long each on average means Slurm answers slowly."""
PROMPT_CALL_S = 1.0
"""... and one below this, that it answers promptly again."""
SLOW_ONE_CALL_S = 4.0
"""... as does a cycle with one call this long (below ``SLOW_CALL_S``: prompt again)."""


def caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc``, or what caused it (up to five links back), is a ``kind``."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says slurmctld did not answer."""
    return caused_by(exc, SlurmUnavailable)


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a Slurm command that kept waiting past its
    timeout while slurmctld answered."""
    return caused_by(exc, SlurmTimeout)


@dataclass
class Outage:
    """Slurm not answering: since when, how it was found, how often it was asked."""

    since: float
    why: str
    looks: int = 1
    excused: float = 0.0
    """How much of it the transitions' clocks were moved on by already."""


@dataclass
class Slowness:
    since: float
    worst_call_s: float
    cycles: int = 1


def serve(
    ctl: Controller, should_stop: Callable[[], bool], sleep: Callable[[float], object]
) -> None:
    """Cycle until ``should_stop``: a full cycle every ``interval_s``, fast ones in between
    while a transition is in flight. While Slurm does not answer, one ping every
    ``interval_s`` (see the module's docstring); a cycle whose Slurm command kept waiting
    past its timeout is a slow spell, said once and retried every ``interval_s``; any
    other failed cycle is retried after a back-off that doubles up to 300 s; a full state
    directory is said once, and retried every ``interval_s`` (nothing is done meanwhile:
    running jobs keep running, none starts, stops or resizes). A lease taken over by
    another controller (:class:`LeaseLost`) ends it at once: it must not act."""
    config = ctl.config
    backoff = config.interval_s
    last_full = -1e18
    full_since = 0.0
    outage: Outage | None = None
    slow: Slowness | None = None
    failed = ""
    clock = ctl.cluster.now
    ttl = ctl.lease.ttl_s if ctl.lease is not None else 1e18
    every = max(0.1, min(config.interval_s, ttl / 4))
    """How often a Slurm that does not answer is asked."""
    while not should_stop():
        t0 = clock()
        if outage is not None:
            try:
                ctl.cluster.ping()
            except Exception:  # not answering, or answering that it is down
                outage.looks += 1
                sleep(every)
                continue
            moved = ctl.excuse(max(0.0, clock() - outage.since - outage.excused))
            outage.excused = max(0.0, clock() - outage.since)
            what = f"the clocks of {moved} job(s) starting or stopping moved on by the outage"
        full = outage is not None or t0 - last_full >= config.interval_s
        try:
            stats = ctl.cycle(full=full)
            backoff = config.interval_s
        except LeaseLost:
            raise
        except Exception as exc:
            if disk_full(exc):
                if not full_since:
                    full_since = t0
                    ctl.warn(
                        f"the controller's state cannot be written ({describe(exc)}): no "
                        "decision until there is space again; running jobs keep running, "
                        "none starts, stops or resizes meanwhile"
                    )
                sleep(config.interval_s)
                continue
            if unavailable(exc) or not _answers(ctl):
                if outage is None:
                    outage = Outage(since=t0, why=describe(exc))
                    ctl.warn(
                        f"Slurm does not answer ({outage.why}): the controller acts on "
                        f"nothing until it does, and asks it again every {every:.0f} s "
                        "(scontrol ping); running jobs keep running"
                    )
                else:
                    outage.looks += 1
                sleep(every)
                continue
            if timed_out(exc):
                # slurmctld answers, but a command of the cycle kept waiting past its
                # timeout: a slow spell, said once, the cycle tried again at the next round
                if slow is None:
                    slow = Slowness(t0, clock() - t0)
                    ctl.warn(
                        f"Slurm answers slowly: {describe(exc)}; the controller acts on "
                        f"nothing this cycle and observes again in {config.interval_s:.0f} s"
                    )
                else:
                    slow.cycles += 1
                    slow.worst_call_s = max(slow.worst_call_s, clock() - t0)
                sleep(config.interval_s)
                continue
            msg = describe(exc)
            if msg != failed:  # the same failure again is not said again
                failed = msg
                ctl.warn(f"cycle failed, retrying in {backoff:.0f} s: {msg}")
            sleep(backoff)
            backoff = min(backoff * 2, 300.0)
            continue
        failed = ""
        if outage is not None:
            ctl.log(
                f"Slurm answers again after {clock() - outage.since:.0f} s ({outage.looks} "
                f"look(s) while it did not: {outage.why}); {what}; this cycle observed the "
                "pool afresh before it acted"
            )
            outage = None
        slow = _slowness(
            ctl,
            slow,
            stats.slurm_calls,
            stats.extra.get("slurm_s", 0.0),
            stats.extra.get("slurm_longest_s", 0.0),
            t0,
        )
        if full_since:
            ctl.log(f"the controller's state is writable again after {t0 - full_since:.0f} s")
            full_since = 0.0
        if full:
            last_full = t0
        wait = ctl.next_interval(stats.slurm_calls)
        if not ctl.in_flight():  # the next full cycle is due interval_s after this one
            wait = max(0.0, last_full + ctl.config.interval_s - t0)
        sleep(max(0.0, wait - (clock() - t0)))


def _answers(ctl: Controller) -> bool:
    """Whether Slurm answers a ping, after a cycle failed with an error that does not say
    it did not (a command run while slurmctld was stopped may fail otherwise: Slurm
    22.05's ``scontrol update`` answered "Unexpected message received")."""
    try:
        ctl.cluster.ping()
    except Exception:
        return False
    return True


def _slowness(
    ctl: Controller, slow: Slowness | None, calls: int, seconds: float, longest: float, now: float
) -> Slowness | None:
    """A spell of slow answers from Slurm, said when it begins and when it ends: a cycle
    whose calls took ``SLOW_CALL_S`` each on average, or one of them ``SLOW_ONE_CALL_S``
    (a slurmctld that runs in bursts answers the calls that reach it in one at once, and
    the others after its pause); over when a cycle's calls and its longest are prompt."""
    per_call = seconds / calls if calls else 0.0
    if slow is None:
        if per_call < SLOW_CALL_S and longest < SLOW_ONE_CALL_S:
            return None
        ctl.warn(
            f"Slurm answers slowly: this cycle's {calls} call(s) took {seconds:.1f} s "
            f"({per_call:.1f} s each, the longest {longest:.1f} s); the controller acts on "
            f"what it observed for at most {ctl.config.stale_after_s:.0f} s, then observes "
            "again"
        )
        return Slowness(now, max(per_call, longest))
    if calls and per_call < PROMPT_CALL_S and longest < SLOW_CALL_S:
        ctl.log(
            f"Slurm answers promptly again after {now - slow.since:.0f} s of slow answers "
            f"({slow.cycles} cycle(s), the longest call {slow.worst_call_s:.1f} s)"
        )
        return None
    slow.cycles += 1
    slow.worst_call_s = max(slow.worst_call_s, longest, per_call)
    return slow
