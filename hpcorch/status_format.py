"""Output formats of ``hpcorch status``, with squeue's habits. Pure.

``-o/--format`` takes either squeue's ``%`` format (``%.18i %.9P %.8j %.2t %.10M %R``:
``%[.][width]letter``, a ``.`` right-justifies, a width pads and truncates, other text is
kept) or a comma-separated list of field names (``jobid,name:20,phase``, a ``:width``
per field), which prints as an aligned table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

STATUS_VERSION = 1
"""Version of the ``status --json`` document; bumped when a field changes meaning."""

COMPACT_STATES = {
    "PD": "PENDING",
    "R": "RUNNING",
    "CG": "COMPLETING",
    "CD": "COMPLETED",
    "CF": "CONFIGURING",
    "F": "FAILED",
    "CA": "CANCELLED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PR": "PREEMPTED",
    "S": "SUSPENDED",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "RQ": "REQUEUED",
    "RH": "REQUEUE_HOLD",
    "RS": "RESIZING",
    "SE": "SPECIAL_EXIT",
    "ST": "STOPPED",
}
"""squeue's compact job state codes (``%t``, and what ``-t`` accepts besides names)."""
JOB_STATES = frozenset(COMPACT_STATES.values())

_PERCENT_RE = re.compile(r"%(\.?)([0-9]{0,3})([A-Za-z%])")
_NAME_RE = re.compile(r"^([a-z]+)(?::([0-9]{1,3}))?$")


class FormatError(ValueError):
    """A format that names an unknown field; the message lists the valid ones."""


@dataclass(frozen=True)
class Field(Generic[T]):
    name: str
    header: str
    get: Callable[[T], str]
    letter: str = ""
    """squeue's ``-o`` letter for the same column, if it has one."""


@dataclass(frozen=True)
class Column(Generic[T]):
    field: Field[T] | None
    """None: literal text."""
    text: str = ""
    width: int = 0
    right: bool = False

    def cell(self, value: str) -> str:
        if self.width:
            value = value[: self.width]
            return value.rjust(self.width) if self.right else value.ljust(self.width)
        return value


@dataclass(frozen=True)
class Format(Generic[T]):
    columns: tuple[Column[T], ...]
    table: bool
    """Named fields: an aligned table; squeue's % format: pieces as given."""


def parse_format(fmt: str, fields: Mapping[str, Field[T]]) -> Format[T]:
    if "%" in fmt:
        return Format(_parse_percent(fmt, fields), table=False)
    columns: list[Column[T]] = []
    for item in fmt.split(","):
        m = _NAME_RE.match(item.strip().lower())
        if not m or m.group(1) not in fields:
            raise FormatError(
                f"unknown status field {item.strip()!r} (valid: {', '.join(fields)}; "
                "or squeue's %-format)"
            )
        columns.append(Column(fields[m.group(1)], width=int(m.group(2) or 0)))
    return Format(tuple(columns), table=True)


def _parse_percent(fmt: str, fields: Mapping[str, Field[T]]) -> tuple[Column[T], ...]:
    by_letter = {f.letter: f for f in fields.values() if f.letter}
    columns: list[Column[T]] = []
    pos = 0
    for m in _PERCENT_RE.finditer(fmt):
        if m.start() > pos:
            _literal(fmt[pos : m.start()])
            columns.append(Column(None, text=fmt[pos : m.start()]))
        pos = m.end()
        right, width, letter = m.group(1) == ".", int(m.group(2) or 0), m.group(3)
        if letter == "%":
            columns.append(Column(None, text="%"))
            continue
        if letter not in by_letter:
            valid = ", ".join(f"%{f.letter} ({f.name})" for f in by_letter.values())
            raise FormatError(f"unknown format field %{letter} (valid: {valid})")
        columns.append(Column(by_letter[letter], width=width, right=right))
    if pos < len(fmt):
        columns.append(Column(None, text=_literal(fmt[pos:])))
    return tuple(columns)


def _literal(text: str) -> str:
    if "%" in text:
        raise FormatError(f"bad format field in {text!r}: use %[.][width]letter")
    return text


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render_rows(fmt: Format[T], rows: Sequence[T], header: bool = True) -> str:
    if fmt.table:
        cols = [c for c in fmt.columns if c.field is not None]
        heads = [c.cell(c.field.header) for c in cols if c.field is not None]
        body = [[c.cell(c.field.get(r)) for c in cols if c.field is not None] for r in rows]
        text = render_table(heads, body)
        return text if header else "\n".join(text.splitlines()[1:])
    lines = []
    if header:
        lines.append("".join(c.cell(c.field.header) if c.field else c.text for c in fmt.columns))
    for r in rows:
        lines.append("".join(c.cell(c.field.get(r)) if c.field else c.text for c in fmt.columns))
    return "\n".join(line.rstrip() for line in lines)
