"""The text squeue prints for ``hpcorch.slurm.squeue_cache.SIGNATURE``, made from a
``squeue --json`` document (for unit tests of the backend without Slurm)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcorch.slurm.squeue_cache import SEP, SIGNATURE


def signature_line(job: Mapping[str, Any]) -> str:
    """One job's line: id, reservation, uid and state from its JSON, a fixed placeholder in
    every other field."""
    values = {
        "JobID": str(job.get("job_id", "")),
        "Reservation": str(job.get("resv_name") or "(null)"),
        "UserId": str(job.get("user_id", "")),
        "State": str(job.get("job_state", "PENDING")),
    }
    return "".join(values.get(f, "x") + SEP for f in SIGNATURE)


def signatures(doc: Mapping[str, Any]) -> str:
    return "".join(signature_line(j) + "\n" for j in doc.get("jobs", []))
