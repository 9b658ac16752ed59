"""hpcorch's log lines through the standard ``logging`` module: one set-up for the
controller, the sidecar and the in-job runtime.

Every record goes to stderr under the ``hpcorch`` logger, in one of two formats:

- ``text`` (default), readable in a job's output and in journald::

      2026-05-04T10:12:03.481 hpcorch-sidecar[26]: launch 1: python train.py (fresh start)
      2026-05-04T10:12:09.022 hpcorch-controller: warning: reservation 'hpcorch' ends in 6 days

  (the level is written for everything but info, as compilers and git do);
- ``json``, one object per line for sites that ship logs to Loki or Elasticsearch::

      {"time": "2026-05-04T08:12:03.481Z", "level": "info", "prog": "hpcorch-controller",
       "logger": "hpcorch.controller", "message": "job 12 started", "slurm_job_id": 12}

  (fields given as ``extra=`` to a log call are added, when JSON can hold them).

The level and format come from the caller (``hpcorch controller --log-level``,
``--log-format``) or from ``HPCORCH_LOG_LEVEL`` / ``HPCORCH_LOG_FORMAT`` (how a job's
runtime and sidecar are told).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
ENV_LEVEL = "HPCORCH_LOG_LEVEL"
ENV_FORMAT = "HPCORCH_LOG_FORMAT"
ROOT = "hpcorch"

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class LogSetupError(ValueError):
    """An unknown log level or format."""


def _choice(value: str, valid: tuple[str, ...], what: str) -> str:
    v = value.strip().lower()
    if v not in valid:
        raise LogSetupError(f"unknown log {what} {value!r} (valid: {', '.join(valid)})")
    return v


class TextFormatter(logging.Formatter):
    """``<local time> <prog>: [<level>: ]<message>``."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        line = f"{t}.{int(record.msecs):03d} {self.prog}: {level}{record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC), level, prog, logger, message, extras."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, Any] = {
            "time": f"{t}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "prog": self.prog,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in doc and not key.startswith("_"):
                doc[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at the time of the record (pytest's capture,
    a redirected stream), not the stream of the moment of set-up."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def configure(
    prog: str,
    level: str | None = None,
    fmt: str | None = None,
    env: Mapping[str, str] | None = None,
) -> logging.Logger:
    """Send the ``hpcorch`` logger's records to stderr as ``prog`` and return it.

    ``level`` and ``fmt`` default to HPCORCH_LOG_LEVEL / HPCORCH_LOG_FORMAT, then
    ``info`` and ``text``; an unknown value raises ``LogSetupError`` naming the valid
    ones. Calling it again replaces hpcorch's handler (never the application's own)."""
    environ = os.environ if env is None else env
    lvl = _choice(level or environ.get(ENV_LEVEL) or "info", LEVELS, "level")
    form = _choice(fmt or environ.get(ENV_FORMAT) or "text", FORMATS, "format")
    logger = logging.getLogger(ROOT)
    for h in list(logger.handlers):
        if getattr(h, "_hpcorch", False):
            logger.removeHandler(h)
    handler = StderrHandler()
    handler._hpcorch = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter(prog) if form == "json" else TextFormatter(prog))
    logger.addHandler(handler)
    logger.setLevel(lvl.upper())
    logger.propagate = False
    return logger


def ensure(prog: str) -> logging.Logger:
    """``configure(prog)`` unless hpcorch's logger already has a handler (the application
    or an earlier call set one up): for code that runs inside someone else's process."""
    logger = logging.getLogger(ROOT)
    if logger.handlers:
        return logger
    try:
        return configure(prog)
    except LogSetupError as exc:  # a bad HPCORCH_LOG_* must not stop training
        logger = configure(prog, "info", "text", env={})
        logger.warning("%s; logging at level info as text", exc)
        return logger
