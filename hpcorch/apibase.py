"""What the Python API's executors share (hpcorch/api.py for Slurm, hpcorch/local.py for
this machine): their options, checked as the command line checks them, a function job's
payload and name, and the error of a job that ended without a result."""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from hpcorch import fnjob
from hpcorch.errors import HpcorchError
from hpcorch.request import SIDECAR_KEYS, RequestError, build_request, sidecar_spec

_ALIASES = {"time": "time_limit", "gpus": "min_gpus", "slurm_setup": "setup"}


class JobError(HpcorchError):
    """The job ended without a result, or its function raised (the message carries the
    remote traceback)."""


def valid_options() -> list[str]:
    names = [
        p.name
        for p in inspect.signature(build_request).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("sidecar", "environ")
    ]
    return sorted([*names, *SIDECAR_KEYS, *_ALIASES])


_HINTS = {"timeout_min": "time (e.g. '4:00:00')", "gpus_per_node": "min_gpus / max_gpus"}
"""What to use instead of the options of submitit's executors that hpcorch has no twin of."""


def request_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(valid_options()))
    if unknown:
        name = unknown[0]
        hint = f"; use {_HINTS[name]}" if name in _HINTS else ""
        raise RequestError(f"unknown option {name!r}{hint} (valid: {', '.join(valid_options())})")
    opts = {_ALIASES.get(k, k): v for k, v in options.items()}
    if opts.get("pool") is None and os.environ.get("HPCORCH_POOL"):
        opts["pool"] = os.environ["HPCORCH_POOL"]  # as `hpcorch submit --pool`'s default
    side = {k: opts.pop(k) for k in SIDECAR_KEYS if k in opts}
    if "resume_args" in side and isinstance(side["resume_args"], str):
        side["resume_args"] = (side["resume_args"],)
    opts["sidecar"] = sidecar_spec(**side)
    if "min_gpus" not in opts:
        raise RequestError("min_gpus is required")
    return opts


def check_options(options: Mapping[str, Any]) -> None:
    """The options' names and values, checked when they are set (not first at submit): a
    bad one raises :class:`RequestError` with one line. ``min_gpus`` may come later."""
    opts = request_kwargs({"min_gpus": 1, **options})
    build_request(fnjob.__file__, (), **opts)


def function_payload(fn: Callable[..., Any], args: Any, kwargs: Any) -> bytes:
    """What a function job loads (hpcorch/fnjob.py): the call, with this process's import
    path; :class:`RequestError` for what is no function or cannot be pickled."""
    if not callable(fn):
        raise RequestError(f"submit() takes a function, got {type(fn).__name__}")
    path = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    try:
        return fnjob.payload(fn, args, kwargs, path)
    except Exception as exc:
        hint = "" if has_cloudpickle() else " (pip install cloudpickle for such functions)"
        raise RequestError(f"the function cannot be pickled: {exc}{hint}") from exc


def name_chars(raw: str) -> str:
    """``raw`` with every character but letters, digits and _ . + - as _ (a job name's)."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", raw)


def job_name_of(fn: Callable[..., Any], limit: int = 64) -> str:
    """A job name from a function's name (letters, digits and _ . + -)."""
    raw = getattr(fn, "__name__", "function")
    return name_chars(raw).lstrip("_.+-")[:limit] or "function"


def has_cloudpickle() -> bool:
    try:
        import cloudpickle  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True
