"""What identifies a job's model, so that jobs of one model share what was learned of them.

The key a policy pools by (``JobView.application``):

* ``<owner>/<app>`` when the job was submitted with ``--app``: one user's name for one of
  their models (two users' ``--app train`` are two keys);
* else ``<owner>/model:<class>:<parameters>:<dataset size>``, the fingerprint the runtime
  reports when training starts (the same model on the same data, as one user runs it).
  Jobs of several users share what was learned of one fingerprint only where the site
  opts in (``hpcorch controller --pool-models-across-users``), and then by a vote of
  owners (:mod:`hpcorch.policy.pooling`);
* else ``job:<Slurm id>``: a job that says nothing about its model is new, and is never
  pooled with others by its script's name.

A key is a presumption, not truth: the policy still drops a job from its group when its
own size or measurements disagree (:mod:`hpcorch.policy.pooling`). Pure.
"""

from __future__ import annotations

import re
from typing import Any

from hpcorch.controller.validate import as_int

MAX_NAME = 64
MAX_COUNT = 10**13
_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def _count(value: Any) -> int:
    """A positive integer the job reported, or 0 (absent, wrong type, out of bounds)."""
    return as_int(value, 1, MAX_COUNT) or 0


def fingerprint(model: Any, params: Any, dataset_size: Any) -> str:
    """``class:parameters:dataset size`` from a start event ('' unless all are sane)."""
    if not isinstance(model, str):
        return ""
    name = _SAFE.sub("", model)[:MAX_NAME]
    n, size = _count(params), _count(dataset_size)
    if not name or not n or not size:
        return ""
    return f"{name}:{n}:{size}"


def model_bytes(value: Any) -> int:
    """The gradient bytes a job reported, bounded (0: not reported or not sane)."""
    return _count(value)


def model_key(user: str, app: str, fp: str, slurm_id: int) -> str:
    """The pooling key of a job (see the module's docstring)."""
    if app:
        return f"{user}/{app}"
    if fp:
        return f"{user}/model:{fp}"
    return f"job:{slurm_id}"
