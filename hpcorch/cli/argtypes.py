"""Click parameter types of the job commands: job ids and lists, strictly ASCII."""

from __future__ import annotations

import re
from typing import Any

import click

MAX_JOB_ID = 0xFFFFFFFD
"""Slurm's job ids are 32-bit; the top values mean NO_VAL/INFINITE."""
_LIST_ITEM_RE = re.compile(r"^[A-Za-z0-9_.+@-]{1,64}$")


def job_id_of(text: str) -> int:
    """A Slurm job id from ASCII digits (``٣`` and ``1e3`` are not job ids)."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 10:
        raise ValueError(f"{text!r} is not a job id (ASCII digits)")
    job_id = int(value)
    if not 1 <= job_id <= MAX_JOB_ID:
        raise ValueError(f"{text!r} is not a job id (1 to {MAX_JOB_ID})")
    return job_id


class JobId(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2
    name = "JOBID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        try:
            return job_id_of(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class JobIdList(click.ParamType):  # type: ignore[type-arg]
    """``ID[,ID...]`` (squeue's -j)."""

    name = "ID[,ID]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            return tuple(job_id_of(v) for v in str(value).split(","))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class NameList(click.ParamType):  # type: ignore[type-arg]
    """``NAME[,NAME...]``: user, job, state or phase names."""

    name = "NAME[,NAME]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = tuple(v.strip() for v in str(value).split(","))
        bad = next((i for i in items if not _LIST_ITEM_RE.match(i)), None)
        if bad is not None:
            self.fail(f"{bad!r} is not a name (letters, digits and _ . + @ -)", param, ctx)
        return items


JOB_ID = JobId()
JOB_ID_LIST = JobIdList()
NAME_LIST = NameList()


def flatten(groups: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
    """The values of a repeatable list option (``-j 1,2 -j 3``)."""
    return tuple(v for g in groups for v in g)
