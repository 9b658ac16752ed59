"""Which of the pool's nodes the jobs must leave, and when: drains, pending reboots and
maintenance windows (other reservations on the pool's nodes). Pure.

An elastic pool can give a node back at a job's next checkpoint, in seconds, where a rigid
job would hold it to its end. A node an admin drains, or whose reboot waits for it to be
empty (``scontrol reboot ASAP``), is *leaving*: every job on it that can be stopped moves
off at its next safe point (resized onto its other nodes, or relaunched elsewhere), and
nothing new is planned there. A window (another reservation, ``Flags=MAINT`` or any) that
starts at T on some nodes makes them *leave* at ``T - lead`` (``lead`` is the preemption
bound: grace + margin, so even a job that ignores its signal is gone by T); before that
they *close* to new launches shortly before (a launch too short to pay its restart is not
made) and every launch started there is given a time limit that ends before T (Slurm
would not start it otherwise). After the window the nodes are the pool's again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hpcorch.cluster import PoolNode, Shape, Window
from hpcorch.controller.actions import Settings
from hpcorch.controller.decide import trained_since
from hpcorch.controller.ends import LEAVING
from hpcorch.controller.snapshot import placement_of
from hpcorch.controller.store import JobRecord
from hpcorch.protocol import SIGNAL_LEAD_S

LIMIT_MARGIN_S = 30.0
"""A launch on a node a window takes has a time limit ending this long before the window
starts: a safety net, the job having moved off at ``lead_s`` before it."""


@dataclass(frozen=True)
class Fate:
    """What is ahead of one node."""

    leave_at: float = 0.0
    """From this time its jobs move off it and nothing is planned on it (0: never)."""
    close_at: float = 0.0
    """From this time no new launch goes there (0: never)."""
    ends_at: float = 0.0
    """A launch there must end before this (a window's start; 0: no bound)."""
    why: str = ""


MIN_LEAD_S = LIMIT_MARGIN_S + SIGNAL_LEAD_S + 30.0
"""Nodes are emptied at least this long before a window (180 s): as a rule before the
checkpoint signal Slurm sends a launch whose limit was cut to end before the window
(``SIGNAL_LEAD_S`` before that limit, which is whole minutes). Slurm may send it up to 60 s
early, and a job may ask for a longer lead of its own: a launch that checkpoints on that
signal first is moved all the same (hpcorch/controller/ends.py)."""


def lead_s(s: Settings) -> float:
    """How long before a window its nodes are emptied: the preemption bound (grace +
    margin: even a job that ignores its signal is gone by the window's start)."""
    return max(s.grace_s + s.force_retry_s, MIN_LEAD_S)


def fates(
    nodes: Sequence[PoolNode], windows: Iterable[Window], now: float, s: Settings
) -> dict[str, Fate]:
    """Each node's fate (nodes with none are left out)."""
    lead = lead_s(s)
    useful = max(s.min_run_s, 60.0)
    out: dict[str, Fate] = {}
    for n in nodes:
        if n.leaving:
            out[n.name] = Fate(now, now, 0.0, n.leaving)
    for w in sorted(windows, key=lambda w: w.start):
        if w.end and w.end <= now:
            continue
        kind = "maintenance window" if w.maintenance else "reservation"
        when = "now" if w.start <= now else f"at {_clock(w.start)}"
        until = f" until {_clock(w.end)}" if w.end else ""
        why = f"{kind} {w.name} {when}{until}"
        for name in w.nodes:
            if name in out:
                continue  # the earliest window (or a drain) decides
            leave = max(now, w.start - lead)
            out[name] = Fate(leave, max(now, leave - useful), w.start, why)
    return out


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def must_move(
    records: Sequence[JobRecord],
    nodes: Sequence[PoolNode],
    fate: Mapping[str, Fate],
    now: float,
    s: Settings,
) -> dict[int, str]:
    """The running jobs that leave their node now, and why: on a node whose time to be
    left has come, able to be stopped (they reported their start: a signal before would
    kill them), and not a job that cannot be resumed (it keeps its GPUs to its end)."""
    index = {n.name: i for i, n in enumerate(nodes)}
    names = [n.name for n in nodes]
    out: dict[int, str] = {}
    for rec in records:
        if rec.phase != "running" or not rec.movable or trained_since(rec, now, s) is None:
            continue
        for i in placement_of(rec, index):
            f = fate.get(names[i])
            if f is not None and 0 < f.leave_at <= now:
                out[rec.slurm_id] = f"{LEAVING}{names[i]}: {f.why}"
                break
    return out


def planned_nodes(
    nodes: Sequence[PoolNode],
    records: Sequence[JobRecord],
    fate: Mapping[str, Fate],
    moving: Mapping[int, str],
    now: float,
) -> tuple[PoolNode, ...]:
    """The pool as the policy is to plan it: a node being left, or closed to new launches,
    counts only the GPUs the jobs that stay on it hold (and those of jobs the controller
    did not place); every other node as it is. A stopping job does not stay: its GPUs
    there, once free, are for no new launch."""
    index = {n.name: i for i, n in enumerate(nodes)}
    staying = [0] * len(nodes)
    for rec in records:
        if rec.phase in ("running", "starting") and rec.slurm_id not in moving:
            for i, g in placement_of(rec, index).items():
                staying[i] += g
    out = []
    for i, n in enumerate(nodes):
        f = fate.get(n.name)
        if f is None or not f.close_at or f.close_at > now:
            out.append(n)
            continue
        if not n.usable and not n.leaving:
            out.append(n)  # failed: Slurm requeues its jobs
            continue
        held = min(n.gpus, staying[i] + n.gpus_foreign)
        out.append(replace(n, gpus=held, usable=True))
    return tuple(out)


def launch_limit(
    rec: JobRecord, shape: Shape, fate: Mapping[str, Fate], now: float, current_min: int
) -> Shape:
    """``shape`` with the time limit its launch gets, where it is not the job's current one
    (``current_min``, as Slurm shows it; 0: none): the job's own (``rec.time_limit_min``,
    if known), cut to end ``LIMIT_MARGIN_S`` before a window on its nodes starts, in which
    case ``rec.limit_cut`` says which. The same on every pass: a start that waits a cycle
    (or more) is given the same limit when it goes."""
    ahead = [(fate[n].ends_at, n) for n in shape.node_names if n in fate]
    ahead = [(t, n) for t, n in ahead if t > now]
    own = rec.time_limit_min
    rec.limit_cut = ""
    want = own
    if ahead:
        ends, node = min(ahead)
        cut = max(1, int((ends - now - LIMIT_MARGIN_S) // 60))
        rec.limit_cut = f"{node}: {fate[node].why}"
        want = min(own, cut) if own > 0 else cut
    if not want or want == (current_min or -1):
        return shape  # unknown, or what the job has already
    return replace(shape, time_limit_min=want)


KEPT_WINDOWS = 100
"""Windows remembered for ``hpcorch report`` (the oldest forgotten first)."""


def remember(known: dict[str, dict[str, Any]], windows: Iterable[Window]) -> bool:
    """Add ``windows`` to ``known`` (key: name and start), as ``hpcorch report`` reads them
    (the store's meta ``windows``); whether anything changed."""
    changed = False
    for w in windows:
        row = {
            "name": w.name,
            "nodes": list(w.nodes),
            "start": w.start,
            "end": w.end,
            "maintenance": w.maintenance,
        }
        key = f"{w.name}@{w.start:.0f}"
        if known.get(key) != row:
            known[key] = row
            changed = True
    while len(known) > KEPT_WINDOWS:
        known.pop(next(iter(known)))
    return changed
