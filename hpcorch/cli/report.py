"""``hpcorch report``: what the scheduler did, as a table, a PNG timeline, or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from hpcorch.cli import params
from hpcorch.cli.poolview import access, ask
from hpcorch.paths import STATE_DB, controller_dir
from hpcorch.report import Report, ReportError, from_store, summary_table

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def load(source: str | None, state_dir: str | None, pool_gpus: int | None) -> Report:
    """The report of SOURCE: a controller state directory or its state.db (live or
    finished; a simulation's kept store too); default: the controller's state directory.
    A user who may not read a live controller's state gets its report from the controller
    (other users' jobs without their batch sizes and losses)."""
    path = Path(source).expanduser() if source else controller_dir(state_dir)
    if path.is_dir():
        path = path / STATE_DB
    if path.name == STATE_DB and access(path.parent) == "socket":  # a user: ask the controller
        reply = ask(path.parent, {"q": "report"})
        try:
            rep = Report.from_json(reply["report"])
        except (KeyError, TypeError, ValueError):
            raise ReportError(f"the controller's report on {path.parent} is malformed") from None
        rep.total_gpus = pool_gpus or rep.total_gpus
        return rep
    return from_store(path, pool_gpus)


def plot(report: Report, out: Path) -> None:
    """A PNG: GPUs per job over time (resizes and batch changes marked), pool utilisation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException(
            "the picture needs matplotlib: pip install 'hpcorch[plot]' (or use --json)"
        ) from None
    jobs = report.jobs
    fig, (ax, ax_u) = plt.subplots(
        2,
        1,
        figsize=(10, 2.2 + 0.9 * max(len(jobs), 1)),
        sharex=True,
        gridspec_kw={"height_ratios": [max(len(jobs), 1) * 1.2, 1.6]},
    )
    span = max(report.end, 1.0)
    # one scale for every bar: a 1-GPU launch is an eighth as high as an 8-GPU one
    most = max((s.gpus for j in jobs for s in [*j.segments, *j.starting]), default=1)
    # a 7-point character (the arrow is wider), in seconds, on the axes of a 10-inch figure
    # (about 7.8 inches after the job labels): 150 per span let "40->80" and "176->240" touch
    char_w = span / 105
    for i, job in enumerate(jobs):
        y = len(jobs) - 1 - i
        colour = COLOURS[i % len(COLOURS)]
        for s in job.starting:
            h = max(0.8 * s.gpus / max(most, 1), 0.06)
            ax.barh(
                y, s.end - s.start, left=s.start, height=h, color="none", edgecolor=colour,
                hatch="///", linewidth=0.6,
            )  # fmt: skip
        for s in job.segments:
            h = max(0.8 * s.gpus / max(most, 1), 0.06)
            ax.barh(y, s.end - s.start, left=s.start, height=h, color=colour, alpha=0.85)
            text = f"{s.gpus} {s.gpu_type}" if s.gpu_type else f"{s.gpus}"
            if s.end - s.start <= char_w * (len(text) + 1):
                text = f"{s.gpus}"  # too short a bar to name the type: the label has it
            if s.end - s.start > 0.04 * span:
                ax.text(
                    (s.start + s.end) / 2, y, text, ha="center", va="center",
                    fontsize=8, color="white", fontweight="bold",
                )  # fmt: skip
        ax.plot([job.submit], [y], marker="|", color="black", markersize=14)
        row_end = [-1e18, -1e18, -1e18]  # right end of the last label on each text row
        for m in job.marks:
            style = {"grow": ("^", "green"), "shrink": ("v", "red"), "batch": ("D", "black")}
            marker, mc = style.get(m.kind, ("o", "grey"))
            ax.plot([m.time], [y + 0.42], marker=marker, color=mc, markersize=7, linestyle="")
            if m.kind != "batch":
                continue
            free = [r for r in range(len(row_end)) if row_end[r] < m.time]
            if not free:
                continue  # no room: the diamond stays, the JSON has every change
            r = free[0]
            row_end[r] = m.time + char_w * (len(m.label) + 2)
            ax.annotate(
                m.label, (m.time, y + 0.42), xytext=(3, 4 + 9 * r),
                textcoords="offset points", fontsize=7,
            )  # fmt: skip
    ax.set_yticks(range(len(jobs)))
    labels = [
        f"{j.name} ({j.job_id})\nJCT {j.jct_s:.0f} s{_on(j.gpu_types)}"
        if j.jct_s is not None
        else j.name
        for j in reversed(jobs)
    ]
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(-0.6, len(jobs) + 0.1)
    ax.set_ylabel(f"job (bar height: GPUs, full row = {most})")
    ax.set_title("GPUs per job over time (bars: training, from the first step each launch reports)")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Line2D([], [], marker="|", color="black", linestyle="", markersize=10, label="submit"),
        Line2D([], [], marker="^", color="green", linestyle="", label="grow"),
        Line2D([], [], marker="v", color="red", linestyle="", label="shrink"),
        Line2D([], [], marker="D", color="black", linestyle="", label="global batch change"),
        Patch(facecolor="none", edgecolor="grey", hatch="///", label="starting (queued, loading)"),
    ]
    for w in report.windows:  # other reservations that took pool nodes: shaded, named
        for a in (ax, ax_u):
            a.axvspan(max(w.start, 0.0), min(w.end, span), color="#e8a33d", alpha=0.18, lw=0)
        ax.text(
            max(w.start, 0.0), len(jobs) - 0.45, f" {w.name}: {','.join(w.nodes)}",
            fontsize=7, color="#8a5a00", va="bottom", clip_on=True,
        )  # fmt: skip
    if report.windows:
        handles.append(Patch(facecolor="#e8a33d", alpha=0.3, label="nodes in another reservation"))
    fig.legend(handles=handles, loc="lower center", fontsize=8, ncol=6, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    if report.utilisation:
        ts = [t for t, _ in report.utilisation] + [report.end]
        gs = [g for _, g in report.utilisation] + [report.utilisation[-1][1]]
        if report.total_gpus:  # a stop and the next start seen in one cycle: not more
            gs = [min(g, report.total_gpus) for g in gs]
        ax_u.step(ts, gs, where="post", color="#444444")
        ax_u.fill_between(ts, gs, step="post", alpha=0.3, color="#444444")
    if report.total_gpus:
        ax_u.axhline(report.total_gpus, color="red", linestyle="--", linewidth=0.8)
        ax_u.set_ylim(0, report.total_gpus * 1.25)
    ax_u.set_ylabel("GPUs training")
    ax_u.set_xlabel("time since first submit (s)")
    ax_u.set_title(
        f"pool utilisation: {100 * report.mean_utilisation():.0f}% of {report.total_gpus} GPUs",
        fontsize=9,
    )
    ax_u.grid(alpha=0.3)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=90)
    plt.close(fig)


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
        for r in [headers, *rows]
    )


PICTURE_SUFFIXES = (".png", ".svg", ".pdf")
"""The picture formats ``--out`` takes, by its name's suffix (matplotlib's choice)."""


@click.command()
@click.argument("source", required=False, type=params.PathType(exists=False))
@click.option(
    "--state-dir",
    envvar="HPCORCH_CONTROLLER_DIR",
    type=params.StateDir(),
    help="Controller state directory [default: $HPCORCH_HOME/controller].",
)
@click.option(
    "--out",
    type=params.PathType(path_type=Path, dir_okay=False),
    default=None,
    help="Write the timeline picture here (.png, .svg or .pdf).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@click.option(
    "--pool-gpus",
    type=params.Integer(1, 1_000_000),
    default=None,
    help="GPUs in the pool, for utilisation [default: the pool's, as the controller last "
    "saw it; else the most ever in use].",
)
def report(
    source: str | None,
    state_dir: str | None,
    out: Path | None,
    as_json: bool,
    pool_gpus: int | None,
) -> None:
    """What the scheduler did: per job its GPUs over time, resizes, batch sizes, JCT.

    SOURCE: a controller state directory or state.db (live or finished pool), or the store a
    simulation kept (`hpcorch simulate --engine controller --keep-state DIR`); default:
    the controller's state directory.
    """
    if out is not None and out.suffix.lower() not in PICTURE_SUFFIXES:
        raise click.BadParameter(
            f"{str(out)!r}: the picture's name must end in .png, .svg or .pdf",
            param_hint="'--out'",
        )
    try:
        rep = load(source, state_dir, pool_gpus)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from None
    if out is not None:
        try:
            plot(rep, out)
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc.strerror}") from None
    if as_json:
        doc: dict[str, Any] = rep.to_json()
        if out is not None:
            doc["picture"] = str(out)
        click.echo(json.dumps(doc, indent=2))
        return
    if not rep.jobs:
        click.echo(f"no jobs in {rep.source}")
    else:
        click.echo(text_table(*summary_table(rep)))
        click.echo(
            f"pool utilisation {100 * rep.mean_utilisation():.0f}% of {rep.total_gpus} GPUs "
            f"over {rep.end:.0f} s"
        )
    for w in rep.windows:
        kind = "maintenance window" if w.maintenance else "reservation"
        click.echo(f"{kind} {w.name} on {','.join(w.nodes)}: {w.start:.0f} s to {w.end:.0f} s")
    if out is not None:
        click.echo(f"picture: {out}")


def _on(types: list[str]) -> str:
    """ ", on a100/v100": the GPU types a job ran on, for its label ("" when untyped)."""
    return f", on {'/'.join(types)}" if types else ""
