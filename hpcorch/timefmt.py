"""Durations as Slurm writes them. Pure.

Slurm reads ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` and ``D-H:M:S``, and
``UNLIMITED`` (or ``INFINITE``) for no limit; squeue prints ``M:SS``, ``H:MM:SS`` and
``D-HH:MM:SS``.
"""

from __future__ import annotations

import re

UNLIMITED = "UNLIMITED"
_UNLIMITED_WORDS = frozenset({"UNLIMITED", "INFINITE"})
_TIME_RE = re.compile(
    r"^(?:(?P<days>[0-9]{1,5})-(?P<dh>[0-9]{1,2})(?::(?P<dm>[0-9]{1,2})(?::(?P<ds>[0-9]{1,2}))?)?"
    r"|(?P<a>[0-9]{1,7})(?::(?P<b>[0-9]{1,2})(?::(?P<c>[0-9]{1,2}))?)?)$"
)
MAX_SECONDS = 365 * 86400 * 100
"""Longer than any site allows: a bound, so that no value overflows downstream."""


class DurationError(ValueError):
    """Not a Slurm duration; the message is one line for people."""


def parse_duration(text: str, what: str = "time limit") -> int | None:
    """Seconds in a Slurm duration; None for UNLIMITED."""
    value = text.strip()
    if value.upper() in _UNLIMITED_WORDS:
        return None
    m = _TIME_RE.match(value)
    if not m:
        raise DurationError(
            f"invalid {what} {text!r}: use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
            "D-HH:MM:SS or UNLIMITED"
        )
    fields = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    bad = (
        fields.get("dh", 0) > 23
        or max(fields.get("dm", 0), fields.get("ds", 0), fields.get("c", 0)) > 59
        or (fields.get("b", 0) > 59)
    )
    if bad:
        raise DurationError(
            f"invalid {what} {text!r}: minutes and seconds after an hour or minute field "
            "must be below 60, hours after a day field below 24"
        )
    if m.group("days") is not None:
        seconds = (
            int(m.group("days")) * 86400
            + int(m.group("dh")) * 3600
            + int(m.group("dm") or 0) * 60
            + int(m.group("ds") or 0)
        )
    elif m.group("c") is not None:
        seconds = int(m.group("a")) * 3600 + int(m.group("b")) * 60 + int(m.group("c"))
    elif m.group("b") is not None:
        seconds = int(m.group("a")) * 60 + int(m.group("b"))
    else:
        seconds = int(m.group("a")) * 60
    if seconds <= 0:
        raise DurationError(f"invalid {what} {text!r}: must be more than zero")
    if seconds > MAX_SECONDS:
        raise DurationError(f"invalid {what} {text!r}: longer than 100 years")
    return seconds


def fmt_duration(seconds: float | None) -> str:
    """As squeue prints a duration: ``0:05``, ``1:02:03``, ``1-02:03:04``; None is
    UNLIMITED."""
    if seconds is None:
        return UNLIMITED
    s = max(0, int(seconds))
    days, rem = divmod(s, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def slurm_minutes(seconds: int) -> str:
    """A time limit for sbatch/scontrol, rounded up to whole minutes (Slurm's unit)."""
    minutes = max(1, -(-seconds // 60))
    days, rem = divmod(minutes, 1440)
    hours, mins = divmod(rem, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours}:{mins:02d}:00"
