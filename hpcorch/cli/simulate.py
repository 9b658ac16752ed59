"""``hpcorch simulate``: trace-driven simulation of scheduling policies."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click

from hpcorch.cli import params
from hpcorch.gputypes import TYPE_RE
from hpcorch.policy import POLICIES, make_policy
from hpcorch.sim import costs, loop
from hpcorch.sim.controlled import INTERVAL_S, simulate_controlled
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.gputypes import load_speeds
from hpcorch.sim.limits import SimLimits
from hpcorch.sim.loop import SimConfig, SimResult
from hpcorch.sim.regime import REGIMES, Regime
from hpcorch.sim.report import RESULT_HEADERS, result_row, table, write_per_job
from hpcorch.sim.traces import TraceError, default_data_dir, load_apps, scale_apps
from hpcorch.sim.workload import WorkloadError, WorkloadJob, load_workload


def _policies(value: str) -> list[str]:
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


def _cpu_demand(values: tuple[str, ...], apps: Collection[str]) -> tuple[tuple[str, float], ...]:
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


def _gpu_types(value: str, nodes: int, engine: str) -> tuple[tuple[str, int], ...]:
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


def _workload_path(value: Path, data: Path) -> Path:
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


class _Lines:
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

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            click.echo(f"simulated: {self.done}/{self.total} jobs done", err=True)


def _progress(total: int) -> Any:
    """A progress bar on a terminal, progress lines elsewhere (both on stderr)."""
    if sys.stderr.isatty():
        return click.progressbar(length=total, label="simulating", file=sys.stderr, show_pos=True)
    return _Lines(total)


@click.command(name="simulate")
@click.argument(
    "workloads",
    nargs=-1,
    required=True,
    type=params.PathType(path_type=Path, dir_okay=False),
)
@click.option(
    "--policy",
    "policy",
    default="ones",
    show_default=True,
    help=f"Policies to compare, comma-separated ({', '.join(sorted(POLICIES))}).",
)
@click.option(
    "--nodes",
    default=16,
    show_default=True,
    type=params.Integer(1, 100_000),
    help="Nodes of the simulated cluster.",
)
@click.option(
    "--gpus-per-node",
    default=4,
    show_default=True,
    type=params.Integer(1, 64),
    help="GPUs on each simulated node.",
)
@click.option(
    "--round",
    "round_s",
    default=60.0,
    show_default=True,
    type=params.Number(1.0, 86400.0),
    help="Seconds between scheduling rounds.",
)
@click.option(
    "--interval",
    "interval_s",
    default=INTERVAL_S,
    show_default=True,
    type=params.Number(1.0, 3600.0),
    help="Seconds between the controller's cycles (1 s while a job starts or stops).",
)
@click.option(
    "--checkpoint-s",
    default=costs.CHECKPOINT_S,
    show_default=True,
    type=params.Number(0.0, 86400.0),
    help="Resize cost: signal -> checkpoint written.",
)
@click.option(
    "--exit-s",
    default=costs.EXIT_S,
    show_default=True,
    type=params.Number(0.0, 86400.0),
    help="Resize cost: checkpoint -> the job's processes have exited.",
)
@click.option(
    "--requeue-s",
    default=costs.REQUEUE_S,
    show_default=True,
    type=params.Number(0.0, 86400.0),
    help="Resize cost: exit -> relaunch (the controller's relaunch delay).",
)
@click.option(
    "--startup-s",
    default=costs.STARTUP_S,
    show_default=True,
    type=params.Number(0.0, 86400.0),
    help="Resize cost: relaunch -> first training step (every start pays it).",
)
@click.option(
    "--startup-per-gpu-s",
    default=costs.STARTUP_PER_GPU_S,
    show_default=True,
    type=params.Number(0.0, 3600.0),
    help="Resize cost: what each GPU's rank adds to a start-up (ranks that share CPUs).",
)
@click.option(
    "--finish-s",
    default=costs.FINISH_S,
    show_default=True,
    type=params.Number(0.0, 86400.0),
    help="A job's last step -> its end in Slurm, holding its GPUs (final checkpoint, exit).",
)
@click.option(
    "--policy-restart-cost",
    default=None,
    type=params.Number(0.0, 86400.0),
    help="--engine controller: what the policy is told a resize costs, as the controller's "
    "--restart-cost [default: the sum of the four parts above].",
)
@click.option(
    "--restart-cost",
    default=None,
    type=params.Number(0.0, 86400.0),
    help="--engine direct: seconds without progress after a job's GPUs or placement change "
    "[default: the sum of the four parts above].",
)
@click.option(
    "--cpus-per-node",
    default=48,
    show_default=True,
    type=params.Integer(1, 4096),
    help="CPUs per node, shared by the data loaders of the jobs on it.",
)
@click.option(
    "--cpu-demand",
    "cpu_demand",
    multiple=True,
    metavar="APP=SECONDS",
    help="Data-loading CPU seconds per sample of an application (repeatable; default 0).",
)
@click.option(
    "--cpus-per-gpu",
    default=0,
    show_default=True,
    type=params.Integer(0, 1024),
    help="Give every job this many CPUs per GPU instead of the policy's choice (0: policy).",
)
@click.option(
    "--seed", default=0, show_default=True, type=params.SEED, help="Seed of the policies."
)
@click.option(
    "--data",
    type=params.PathType(path_type=Path, file_okay=False),
    default=None,
    help="Trace data directory [default: $HPCORCH_POLLUX_DATA, else the Pollux artifact's "
    "data bundled with hpcorch].",
)
@click.option(
    "--engine",
    type=click.Choice(["controller", "direct"]),
    default="controller",
    show_default=True,
    help="controller: the production controller over a simulated Slurm; direct: a bare "
    "round-by-round policy loop (kept as a test oracle).",
)
@click.option(
    "--regime",
    type=click.Choice(list(REGIMES)),
    default="known",
    show_default=True,
    help="What the policy knows of a job before it runs. known: jobs of one application "
    "share what was learned of them; cold: every job is new (its own application, no "
    "completed-job history); mixed: every other job (by arrival) is new.",
)
@click.option(
    "--declared-epochs",
    default=1.0,
    show_default=True,
    type=params.Number(0.01, 100.0),
    help="Epochs the jobs declare, as a multiple of those they really need (robustness).",
)
@click.option(
    "--time-scale",
    default=1.0,
    show_default=True,
    type=params.Number(0.0001, 1.0),
    help="Every job does this fraction of its work (steps take their measured time; "
    "start-up and resize costs are not scaled): a replay's time scale. Scale the "
    "workload's arrival times with it.",
)
@click.option(
    "--gpu-types",
    "gpu_types",
    default="",
    metavar="TYPE:NODES,...",
    help="A pool of several GPU types (engine controller), e.g. a100:4,v100:4,t4:8: the "
    "nodes of each type in node order, adding up to --nodes. Each application runs on a "
    "type at its speed factor (hpcorch/sim/data/gpu-types).",
)
@click.option(
    "--users",
    default=1,
    show_default=True,
    type=params.Integer(1, 100_000),
    help="Engine controller: the jobs' users, given in turn (u0, u1, ...).",
)
@click.option(
    "--user-gpu-limit",
    type=params.GPUS,
    default=None,
    help="Engine controller: a QOS's MaxTRESPerUser=gres/gpu=N; the simulated Slurm keeps "
    "a launch over it pending (QOSMaxGRESPerUser), as Slurm does.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--plot",
    type=params.PathType(path_type=Path, dir_okay=False),
    default=None,
    help="Write a PNG: JCT CDF per policy and GPUs in use over time.",
)
@click.option(
    "--keep-state",
    type=params.PathType(path_type=Path, file_okay=False),
    default=None,
    help="Engine controller: keep each run's controller store here as WORKLOAD-POLICY.db "
    "(for `hpcorch report`).",
)
@click.option(
    "--per-job",
    type=params.PathType(path_type=Path, dir_okay=False),
    default=None,
    help="Write per-job results (JCT, queueing delay, restarts) to this CSV file.",
)
def simulate(
    workloads: tuple[Path, ...],
    policy: str,
    nodes: int,
    gpus_per_node: int,
    round_s: float,
    interval_s: float,
    checkpoint_s: float,
    exit_s: float,
    requeue_s: float,
    startup_s: float,
    startup_per_gpu_s: float,
    finish_s: float,
    policy_restart_cost: float | None,
    restart_cost: float | None,
    cpus_per_node: int,
    cpu_demand: tuple[str, ...],
    cpus_per_gpu: int,
    seed: int,
    data: Path | None,
    engine: str,
    regime: str,
    declared_epochs: float,
    time_scale: float,
    gpu_types: str,
    users: int,
    user_gpu_limit: int | None,
    as_json: bool,
    plot: Path | None,
    keep_state: Path | None,
    per_job: Path | None,
) -> None:
    """Simulate scheduling policies on workload CSV files (name,time,application,...).

    A WORKLOAD is a CSV path or the name of a bundled workload, e.g. load-1.0/workload-6.
    """
    names = _policies(policy)
    try:
        apps = scale_apps(load_apps(data), time_scale)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    root = data or default_data_dir()
    loaded: list[tuple[str, list[WorkloadJob]]] = []
    for path in (_workload_path(w, root) for w in workloads):
        try:
            loaded.append((path.stem, load_workload(path, apps)))
        except WorkloadError as exc:
            raise click.ClickException(str(exc)) from None
    demand = _cpu_demand(cpu_demand, apps)
    if cpus_per_node < gpus_per_node or cpus_per_gpu * gpus_per_node > cpus_per_node:
        raise click.BadParameter(
            f"{cpus_per_node} CPUs per node cannot give every one of {gpus_per_node} GPUs "
            f"{max(cpus_per_gpu, 1)} CPUs",
            param_hint="--cpus-per-node",
        )
    if engine == "controller" and restart_cost is not None:
        raise click.UsageError(
            "--restart-cost is for --engine direct; the controller engine charges "
            "--checkpoint-s, --exit-s, --requeue-s and --startup-s"
        )
    cost = ResizeCost(checkpoint_s, exit_s, requeue_s, startup_s, startup_per_gpu_s, finish_s)
    if keep_state is not None and engine != "controller":
        raise click.UsageError("--keep-state needs --engine controller")
    if keep_state is not None:
        try:
            keep_state.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.ClickException(f"cannot create {keep_state}: {exc.strerror}") from None
    typed = _gpu_types(gpu_types, nodes, engine)
    if (users > 1 or user_gpu_limit) and engine != "controller":
        raise click.UsageError("--users and --user-gpu-limit need --engine controller")
    limits = SimLimits(users, user_gpu_limit) if users > 1 or user_gpu_limit else None
    config = SimConfig(
        nodes,
        gpus_per_node,
        round_s,
        cost.total if restart_cost is None else restart_cost,
        cpus_per_node=cpus_per_node,
        cpu_demand=demand,
        cpus_per_gpu=cpus_per_gpu,
        regime=Regime(regime, declared_epochs),
        gpu_types=typed,
    )
    total = sum(len(jobs) for _, jobs in loaded) * len(names)
    results: list[tuple[str, SimResult]] = []
    with _progress(total) as bar:
        for stem, jobs in loaded:
            for name in names:
                seen = [0]

                def tick(cluster: SimCluster, seen: list[int] = seen) -> None:
                    done = sum(1 for j in cluster.jobs if j.done)
                    if done > seen[0]:
                        bar.update(done - seen[0])
                        seen[0] = done

                bar.label = f"{stem} {name}"
                try:
                    if engine == "direct":
                        run = loop.simulate(jobs, make_policy(name, seed), apps, config, tick)
                    else:
                        kept = keep_state / f"{stem}-{name}.db" if keep_state else None
                        run = simulate_controlled(
                            jobs,
                            make_policy(name, seed),
                            apps,
                            config,
                            tick,
                            cost=cost,
                            restart_cost_s=policy_restart_cost,
                            interval_s=interval_s,
                            keep_state=kept,
                            limits=limits,
                        )
                except (TraceError, RuntimeError) as exc:
                    raise click.ClickException(f"{stem} {name}: {exc}") from None
                results.append((stem, run))
    if as_json:
        doc = {
            "results": [
                {"workload": stem, "policy": r.policy, "regime": regime, **r.summary()}
                for stem, r in results
            ]
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(table(RESULT_HEADERS, [result_row(stem, r) for stem, r in results]))
    if per_job is not None:
        try:
            write_per_job(results, per_job)
        except OSError as exc:
            raise click.ClickException(f"cannot write {per_job}: {exc.strerror}") from None
    if plot is not None:
        from hpcorch.sim.report import plot as draw

        try:
            draw(results, plot)
        except OSError as exc:
            raise click.ClickException(f"cannot write plot {plot}: {exc.strerror}") from None
        if not as_json:
            click.echo(f"plot written to {plot}")
