"""The controller as a long-running service: its cycles until it is told to stop, a failed
cycle retried after a back-off, a full state directory said once, and the pool's lease
(hpcorch/controller/lease.py) lost or held. ``hpcorch controller`` runs :func:`serve`."""

from __future__ import annotations

from collections.abc import Callable

from hpcorch.controller.lease import LeaseLost
from hpcorch.controller.logs import describe, disk_full
from hpcorch.controller.loop import Controller


def serve(
    ctl: Controller, should_stop: Callable[[], bool], sleep: Callable[[float], object]
) -> None:
    """Cycle until ``should_stop``: a full cycle every ``interval_s``, fast ones in between
    while a transition is in flight. A failed cycle is retried after a back-off; a full
    state directory is said once, and retried every ``interval_s`` (nothing is done
    meanwhile: running jobs keep running, none starts, stops or resizes). A lease taken
    over by another controller (:class:`LeaseLost`) ends it at once: it must not act."""
    config = ctl.config
    backoff = config.interval_s
    last_full = -1e18
    full_since = 0.0
    clock = ctl.cluster.now
    while not should_stop():
        t0 = clock()
        full = t0 - last_full >= config.interval_s
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
            ctl.warn(f"cycle failed, retrying in {backoff:.0f} s: {describe(exc)}")
            sleep(backoff)
            backoff = min(backoff * 2, 300.0)
            continue
        if full_since:
            ctl.log(f"the controller's state is writable again after {t0 - full_since:.0f} s")
            full_since = 0.0
        if full:
            last_full = t0
        wait = ctl.next_interval(stats.slurm_calls)
        if not ctl.in_flight():  # the next full cycle is due interval_s after this one
            wait = max(0.0, last_full + config.interval_s - t0)
        sleep(max(0.0, wait - (clock() - t0)))
