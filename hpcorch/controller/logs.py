"""The controller's log lines: through stdlib logging, each labelled with the Slurm job it
is about, and one line about an exception."""

from __future__ import annotations

import errno
import logging
import re
import sqlite3
from typing import Any

from hpcorch.controller.validate import printable
from hpcorch.errors import HpcorchError

logger = logging.getLogger("hpcorch.controller")
_JOB_RE = re.compile(r"job (\d+)\b")


def _extra(msg: str) -> dict[str, Any]:
    """The Slurm job a line is about, as a field of its own (JSON logs: a label)."""
    m = _JOB_RE.match(msg)
    return {"slurm_job_id": int(m.group(1))} if m else {}


def log_info(msg: str) -> None:
    logger.info("%s", msg, extra=_extra(msg))


def log_warning(msg: str) -> None:
    logger.warning("%s", msg, extra=_extra(msg))


def describe(exc: BaseException) -> str:
    """One line about ``exc``: its message for hpcorch's own errors, else its type, message
    and where it was raised."""
    if isinstance(exc, HpcorchError):
        return printable(str(exc), 300)
    if isinstance(exc, OSError) and exc.strerror:
        return printable(f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror, 300)
    where = ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        code = tb.tb_frame.f_code
        where = f" (at {code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno})"
    return printable(f"{type(exc).__name__}: {exc}", 300) + where


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the state's file system is full (or over
    quota)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(seen, sqlite3.OperationalError) and "full" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False
