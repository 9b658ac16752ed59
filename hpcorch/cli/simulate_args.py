"""The arguments of ``hpcorch simulate`` checked and converted (one clear error each),
and its progress on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click

from hpcorch.cli import params
from hpcorch.gputypes import TYPE_RE
from hpcorch.policy import POLICIES
from hpcorch.sim.gputypes import load_speeds
from hpcorch.sim.traces import TraceError


def policy_names(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter("no policy given", param_hint="--policy")
    for name in names:
        if name not in POLICIES:
            raise click.BadParameter(
                f"unknown policy {name!r} (valid: {', '.join(sorted(POLICIES))})",
                param_hint="--policy",
            )
    return names


def cpu_demand_of(values: tuple[str, ...], apps: Collection[str]) -> tuple[tuple[str, float], ...]:
    out: dict[str, float] = {}
    for value in values:
        app, sep, text = value.partition("=")
        app = app.strip()
        try:
            seconds = params.Number(0.0, 3600.0).convert(text, None, None)
        except click.BadParameter:
            seconds = -1.0
        if not sep or seconds < 0:
            raise click.BadParameter(
                f"{value!r} is not APP=SECONDS (e.g. cifar10=0.002)", param_hint="--cpu-demand"
            )
        if app not in apps:
            raise click.BadParameter(
                f"unknown application {app!r} (valid: {', '.join(sorted(apps))})",
                param_hint="--cpu-demand",
            )
        out[app] = seconds
    return tuple(sorted(out.items()))


def gpu_types_of(value: str, nodes: int, engine: str) -> tuple[tuple[str, int], ...]:
    """``a100:4,t4:12`` as ((type, nodes), ...), checked against the speed table."""
    if not value:
        return ()
    hint = "--gpu-types"
    if engine != "controller":
        raise click.UsageError("--gpu-types needs --engine controller")
    out: list[tuple[str, int]] = []
    for part in value.split(","):
        name, _, count = part.partition(":")
        if not TYPE_RE.fullmatch(name) or not count.isdigit() or int(count) < 1:
            raise click.BadParameter(f"{part!r} is not TYPE:NODES", param_hint=hint)
        if name in dict(out):
            raise click.BadParameter(f"GPU type {name} is given twice", param_hint=hint)
        out.append((name, int(count)))
    try:
        known = load_speeds()
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    for name, _ in out:
        if name not in known:
            valid = ", ".join(sorted(known))
            raise click.BadParameter(
                f"no speed factors for {name} (valid: {valid})", param_hint=hint
            )
    if sum(n for _, n in out) != nodes:
        raise click.BadParameter(
            f"{sum(n for _, n in out)} nodes given, --nodes is {nodes}", param_hint=hint
        )
    return tuple(out)


def workload_path(value: Path, data: Path) -> Path:
    """A workload CSV: the path as given, else a workload of the data directory by name
    (``load-1.0/workload-6`` stands for ``<data>/workloads/load-1.0/workload-6.csv``)."""
    if value.exists() or value.is_absolute():
        return value
    name = str(value).removesuffix(".csv")
    bundled = data / "workloads" / f"{name}.csv"
    if bundled.is_file():
        return bundled
    known = sorted(f"{p.parent.name}/{p.stem}" for p in (data / "workloads").glob("*/*.csv"))
    hint = f" (or a bundled workload: {', '.join(known[:3])}, ...)" if known else ""
    raise click.BadParameter(f"no file {str(value)!r}{hint}", param_hint="WORKLOADS")


class ProgressLines:
    """Progress where stderr is no terminal (a batch job's log, a pipe): one line when a
    run starts and at most one every ``every`` seconds while it runs."""

    def __init__(self, total: int, every: float = 30.0) -> None:
        self.total, self.every, self.done = total, every, 0
        self._label = ""
        self._said = time.monotonic()

    @property
    def label(self) -> str:
        return self._label

    @label.setter
    def label(self, value: str) -> None:
        self._label = value
        self._say()

    def update(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self._said >= self.every:
            self._say()

    def _say(self) -> None:
        self._said = time.monotonic()
        click.echo(f"simulating {self._label}: {self.done}/{self.total} jobs done", err=True)

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            click.echo(f"simulated: {self.done}/{self.total} jobs done", err=True)


def progress(total: int) -> Any:
    """A progress bar on a terminal, progress lines elsewhere (both on stderr)."""
    if sys.stderr.isatty():
        return click.progressbar(length=total, label="simulating", file=sys.stderr, show_pos=True)
    return ProgressLines(total)
