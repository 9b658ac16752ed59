"""Slurm's compressed lists, parsed in pure Python: hostlists (``gpu-a[001-008]``,
``rack[1-2]-n[01-02]``) and tasks-per-node lists (``2(x3),1``).

One implementation for every place that cannot start ``scontrol show hostnames``: the
controller's cycle (a subprocess per job would make Slurm calls grow with the number of
jobs) and the in-job runtime. ``tests/test_hostlist.py`` checks it against
``scontrol show hostnames`` itself.

The grammar is Slurm's: items separated by commas or white space; an item is text with
any number of bracket groups, each a comma list of numbers or ``lo-hi`` ranges; several
groups expand as a product (``c[1-2][3-4]`` -> ``c13 c14 c23 c24``); a range is padded to
the width of its lower bound (``n[08-11]`` -> ``n08 ... n11``, ``n[1-10]`` -> ``n1 ...
n10``). Text after the last group is kept (``n[1-3]x`` -> ``n1x n2x n3x``), as newer
Slurm releases and every other hostlist tool do (Slurm 22.05's scontrol refuses it).
"""

from __future__ import annotations

import itertools
import re

MAX_HOSTS = 1_000_000
"""A hostlist that expands to more names than this is refused (no real cluster has it)."""

_TASKS_RE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_DIGITS = re.compile(r"[0-9]+")


class HostlistError(ValueError):
    """Not a valid Slurm hostlist (or tasks-per-node list)."""


def _split_items(hostlist: str) -> list[str]:
    """Split at commas and white space outside brackets; reject unbalanced brackets."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in hostlist:
        if ch == "[":
            if depth:
                raise HostlistError(f"invalid hostlist {hostlist!r}: nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"invalid hostlist {hostlist!r}: ']' without '['")
            depth = 0
        elif depth == 0 and (ch == "," or ch.isspace()):
            if current:
                items.append("".join(current))
            current = []
            continue
        current.append(ch)
    if depth:
        raise HostlistError(f"invalid hostlist {hostlist!r}: '[' without ']'")
    if current:
        items.append("".join(current))
    return items


def _numbers(group: str, hostlist: str) -> list[str]:
    """``01-03,7`` -> ``['01', '02', '03', '7']``: each range padded to its lower bound."""
    out: list[str] = []
    for part in group.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not _DIGITS.fullmatch(lo) or (dash and not _DIGITS.fullmatch(hi)):
            raise HostlistError(f"invalid hostlist {hostlist!r}: bad range {part!r}")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise HostlistError(f"invalid hostlist {hostlist!r}: range {part!r} runs backwards")
        if last - first >= MAX_HOSTS:
            raise HostlistError(f"invalid hostlist {hostlist!r}: range {part!r} is too long")
        width = len(lo)
        out += [f"{i:0{width}d}" for i in range(first, last + 1)]
    return out


def expand(hostlist: str) -> list[str]:
    """Every host name of ``hostlist``, in Slurm's order (duplicates kept, as Slurm does).

    >>> expand("rack[1-2]-n[01-02],c196-011")
    ['rack1-n01', 'rack1-n02', 'rack2-n01', 'rack2-n02', 'c196-011']
    """
    names: list[str] = []
    for item in _split_items(hostlist):
        pieces = re.split(r"\[([^\]]*)\]", item)  # text, group, text, group, ..., text
        choices: list[list[str]] = []
        for i, piece in enumerate(pieces):
            choices.append(_numbers(piece, hostlist) if i % 2 else [piece])
        count = 1
        for c in choices:
            count *= len(c)
        if len(names) + count > MAX_HOSTS:
            raise HostlistError(f"hostlist {hostlist[:60]!r} names more than {MAX_HOSTS} hosts")
        names += ["".join(p) for p in itertools.product(*choices)]
    return names


def first(hostlist: str) -> str:
    """The first host of ``hostlist`` (a job's first node: where rank 0 runs)."""
    names = expand(hostlist)
    if not names:
        raise HostlistError(f"hostlist {hostlist!r} names no host")
    return names[0]


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE`` form, ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in spec.split(","):
        m = _TASKS_RE.fullmatch(part.strip())
        if not m:
            raise HostlistError(f"cannot parse Slurm tasks-per-node list {spec!r}")
        repeat = int(m.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS:
            raise HostlistError(f"tasks-per-node list {spec[:60]!r} names too many nodes")
        counts += [int(m.group(1))] * repeat
    return counts
