"""Why a queued job waits, in words its owner can act on. Pure.

"waiting for GPUs" alone hid three causes a user can do something about, or should at least
know of: a minimum the pool can never give, GPUs out of service, and GPUs held by a launch
that has not yet said it started (it may keep them for the whole start-up allowance).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcorch.cluster import PoolNode
from hpcorch.controller.actions import Settings
from hpcorch.controller.store import JobRecord

WAITING = "waiting for GPUs"
NEVER = "can never start in this pool"
STARTUP_NOTE_S = 60.0
"""A launch that has not reported its start after this long (or a tenth of the start-up
allowance, if less) is named as the reason others wait, and says so in its own reason."""


def silent(rec: JobRecord, now: float, s: Settings) -> bool:
    """A running launch that has not reported its start for a while, within its start-up
    allowance (after it, it counts as started)."""
    waited = now - rec.phase_since
    note = min(STARTUP_NOTE_S, s.startup_s / 10)
    return rec.phase == "running" and not rec.ready and 0 < note <= waited < s.startup_s


def fits(rec: JobRecord, nodes: Sequence[PoolNode]) -> int:
    """The GPUs a queued job could be given now: those of the pool's nodes in service, of a
    type it accepts, less those held by jobs the controller did not place."""
    kinds = rec.accepted_types()
    return sum(
        max(0, n.gpus - n.gpus_foreign)
        for n in nodes
        if n.usable and (not kinds or n.gpu_type in kinds)
    )


def silent_launches(records: Sequence[JobRecord], now: float, s: Settings) -> list[JobRecord]:
    """The launches that have not reported their start for a while (``silent``)."""
    return [r for r in records if silent(r, now, s)]


def why_waiting(
    rec: JobRecord,
    records: Sequence[JobRecord],
    nodes: Sequence[PoolNode],
    now: float,
    s: Settings,
    holders: Sequence[JobRecord] | None = None,
) -> str:
    """The reason a queued job the policy did not start shows. ``holders``: the
    ``silent_launches`` of ``records``, when the caller asks for many queued jobs."""
    kinds = rec.accepted_types()
    mine = [n for n in nodes if not kinds or n.gpu_type in kinds]
    total = sum(n.gpus for n in mine)
    of = f" of type {', '.join(kinds)}" if kinds else ""
    if rec.min_gpus > total:
        return (
            f"{NEVER}: it needs at least {rec.min_gpus} GPUs (--min-gpus) and the pool has "
            f"{total} GPUs{of}; cancel it (scancel {rec.slurm_id}) and resubmit with fewer"
        )
    usable = fits(rec, nodes)
    if rec.min_gpus > usable:
        out = [n.name for n in mine if not n.usable]
        foreign = sum(n.gpus_foreign for n in mine if n.usable)
        why = []
        if out:
            more = ", ..." if len(out) > 4 else ""
            why.append(f"{', '.join(out[:4])}{more} drained, down or rebooting")
        if foreign:
            why.append(f"{foreign} held by jobs the controller did not place")
        return (
            f"{WAITING}: it needs at least {rec.min_gpus}, {usable} of the pool's {total} "
            f"GPUs{of} can be given now ({'; '.join(why)})"
        )
    if holders is None:
        holders = silent_launches(records, now, s)
    if holders:
        r = max(holders, key=lambda h: h.gpus)
        more = f" (and {len(holders) - 1} more launch(es))" if len(holders) > 1 else ""
        return (
            f"{WAITING}: job {r.slurm_id} holds {r.gpus} GPUs and has not reported its start "
            f"after {now - r.phase_since:.0f} s{more}; the start-up allowance lets a launch "
            f"keep its GPUs {s.startup_s:.0f} s at most before it may be stopped"
        )
    return WAITING
