"""Workload CSV files: ``name,time,application,num_replicas,batch_size``."""

from __future__ import annotations

import csv
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


class WorkloadError(ValueError):
    """A workload file that cannot be simulated; the message is one line for users."""


@dataclass(frozen=True)
class WorkloadJob:
    """One submitted job: arrival time and the configuration the user asked for."""

    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int


def _number(
    path: Path, line: int, row: dict[str, str], column: str, kind: type[float] | type[int]
) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = kind(text)
    except ValueError:
        raise WorkloadError(f"{path}:{line}: {column} is not a number: {text!r}") from None
    if value < 0:
        raise WorkloadError(f"{path}:{line}: {column} must not be negative, got {text}")
    return value


def load_workload(path: Path, applications: Collection[str]) -> list[WorkloadJob]:
    """Parse and check ``path``; raise :class:`WorkloadError` naming the first problem."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise WorkloadError(
                    f"{path}: missing column(s) {', '.join(missing)} (expected {','.join(COLUMNS)})"
                )
            rows = list(reader)
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read workload: {exc.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise WorkloadError(f"{path}: not a CSV workload file: {exc}") from None
    jobs: list[WorkloadJob] = []
    names: set[str] = set()
    valid = sorted(applications)
    for i, row in enumerate(rows, start=2):
        name = (row.get("name") or "").strip()
        if not name:
            raise WorkloadError(f"{path}:{i}: empty job name")
        if name in names:
            raise WorkloadError(f"{path}:{i}: duplicate job name {name!r}")
        names.add(name)
        app = (row.get("application") or "").strip()
        if app not in applications:
            raise WorkloadError(
                f"{path}:{i}: unknown application {app!r} (valid: {', '.join(valid)})"
            )
        time = _number(path, i, row, "time", float)
        replicas = int(_number(path, i, row, "num_replicas", int))
        batch = int(_number(path, i, row, "batch_size", int))
        if replicas < 1 or batch < 1:
            raise WorkloadError(f"{path}:{i}: num_replicas and batch_size must be >= 1")
        jobs.append(WorkloadJob(name, time, app, replicas, batch))
    if not jobs:
        raise WorkloadError(f"{path}: workload has no jobs")
    jobs.sort(key=lambda j: j.time)
    return jobs
