"""Click parameter types of the job commands: lists of job ids and names, strictly ASCII.
A single job id is ``hpcorch.cli.params.JOB_ID``; a list checks each item with it."""

from __future__ import annotations

import re
from typing import Any

import click

from hpcorch.cli.params import JOB_ID

_LIST_ITEM_RE = re.compile(r"^[A-Za-z0-9_.+@-]{1,64}$")


class JobIdList(click.ParamType):  # type: ignore[type-arg]
    """``ID[,ID...]`` (squeue's -j)."""

    name = "ID[,ID]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(JOB_ID.convert(v, param, ctx) for v in str(value).split(","))


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


JOB_ID_LIST = JobIdList()
NAME_LIST = NameList()


def flatten(groups: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
    """The values of a repeatable list option (``-j 1,2 -j 3``)."""
    return tuple(v for g in groups for v in g)
