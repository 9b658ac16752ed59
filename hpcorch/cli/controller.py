"""``hpcorch controller`` and ``metrics``."""

from __future__ import annotations

import fcntl
import getpass
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import click

from hpcorch import logsetup
from hpcorch.cli import params
from hpcorch.cli.config import config_option
from hpcorch.cluster import ENDED_STATES
from hpcorch.controller.config import PARALLEL_ACTIONS
from hpcorch.controller.lease import DEFAULT_TTL_S, Lease, LeaseLost
from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.query_server import QueryServer
from hpcorch.controller.reconcile import Settings
from hpcorch.controller.service import serve
from hpcorch.controller.store import Store
from hpcorch.errors import HpcorchError
from hpcorch.paths import STATE_DB, controller_dir
from hpcorch.policy import POLICIES, make_policy
from hpcorch.policy.pooling import AcrossOwners
from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.cluster import SlurmCluster
from hpcorch.slurm.factory import backend_name
from hpcorch.slurm.files import Spool
from hpcorch.slurm.script import parse_comment
from hpcorch.slurm.version import behaviour, check_supported

state_dir_option = click.option(
    "--state-dir",
    envvar="HPCORCH_CONTROLLER_DIR",
    type=params.StateDir(),
    help="Controller state directory [default: $HPCORCH_HOME/controller].",
)


@contextmanager
def _lock(directory: Path) -> Iterator[None]:
    path = directory / "controller.lock"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        fh = open(path, "a+")  # noqa: SIM115 (held for the controller's lifetime)
    except OSError as exc:
        raise click.ClickException(
            f"cannot use {exc.filename or path} as the controller's state: {exc.strerror}"
        ) from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        pid = fh.read().strip() or "?"
        fh.close()
        raise click.ClickException(
            f"another controller already runs on {directory} (pid {pid})"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    try:
        yield
    finally:
        fh.close()


@click.command()
@click.option(
    "--reservation",
    default="hpcorch",
    show_default=True,
    type=params.Name(),
    help="The Slurm reservation that is the pool (created if missing).",
)
@click.option(
    "--nodes",
    type=params.NameList(hostlist=True),
    help="Nodes of a new reservation, e.g. n[1-4], or a count of idle GPU nodes of the "
    "partition, e.g. 4 (required to create one; the controller holds only these).",
)
@click.option("--users", type=params.NameList(), help="Users of a new reservation [default: you].")
@click.option("--partition", type=params.Name(), help="Partition of a new reservation.")
@click.option(
    "--policy",
    type=click.Choice(sorted(POLICIES)),
    default="ones",
    show_default=True,
    help="The scheduling policy that decides GPUs and batch sizes.",
)
@click.option(
    "--interval",
    type=params.Number(0.1, 3600.0),
    default=10.0,
    show_default=True,
    help="Seconds between cycles.",
)
@click.option(
    "--fast-interval",
    type=params.Number(0.05, 60.0),
    default=0.25,
    show_default=True,
    help="Seconds between cycles while a job is starting or stopping.",
)
@click.option(
    "--max-calls",
    type=params.Number(0.1, 1000.0),
    default=8.0,
    show_default=True,
    help="Slurm calls per second the fast cycles make at most.",
)
@click.option(
    "--round",
    "round_s",
    type=params.Number(0.1, 86400.0),
    default=60.0,
    show_default=True,
    help="Seconds between scheduling rounds.",
)
@click.option(
    "--restart-cost",
    type=params.Number(0.0, 86400.0),
    default=30.0,
    show_default=True,
    help="Seconds a resize costs a job, as the policy assumes.",
)
@click.option(
    "--grace",
    type=params.Number(1.0, 86400.0),
    default=120.0,
    show_default=True,
    help="Seconds a job has to checkpoint before it is requeued by force.",
)
@click.option(
    "--launch-pending",
    type=params.Number(5.0, 86400.0),
    default=90.0,
    show_default=True,
    help="Seconds Slurm may keep a released launch pending before it is held and planned again.",
)
@click.option(
    "--startup",
    type=params.Number(10.0, 86400.0),
    default=600.0,
    show_default=True,
    help="Seconds a launch may take to report that training started; it keeps its GPUs "
    "meanwhile (it cannot checkpoint yet), then may be stopped like any other.",
)
@click.option(
    "--max-retries",
    type=params.Integer(0, 1000),
    default=2,
    show_default=True,
    help="Relaunches of a failed job (from its last checkpoint) before it is left failed.",
)
@click.option(
    "--min-run",
    type=params.Number(0.0, 86400.0),
    default=60.0,
    show_default=True,
    help="Seconds a launch runs before it may be resized.",
)
@click.option(
    "--seed", type=params.SEED, default=0, show_default=True, help="Random seed of the policy."
)
@click.option(
    "--pool-models-across-users",
    is_flag=True,
    help="Let jobs of different users that report one model fingerprint share what was "
    "learned of it (by a vote of owners); by default only one user's jobs pool.",
)
@click.option(
    "--mix-gpu-types",
    is_flag=True,
    help="Let one launch span nodes of several GPU types (it trains at the slowest one's "
    "speed); by default each launch is on one type.",
)
@click.option(
    "--lease-ttl",
    type=params.Number(10.0, 3600.0),
    default=DEFAULT_TTL_S,
    show_default=True,
    help="Seconds without a heartbeat after which another controller may take the pool "
    "over (one controller acts on a pool: a second one, on any host, stands by).",
)
@click.option("--once", is_flag=True, help="Run one cycle and exit.")
@click.option(
    "--spool",
    envvar="HPCORCH_SPOOL",
    type=params.StateDir(writable=True),
    help="Where the controller writes each job's plan, on a file system the nodes share "
    "[default: STATE_DIR/jobs].",
)
@click.option(
    "--adopt",
    is_flag=True,
    help="Take over a state directory kept for another reservation (its jobs are then "
    "lost), or start with an empty state beside a reservation that holds hpcorch jobs "
    "(they are adopted as new).",
)
@state_dir_option
@click.option(
    "--log-level",
    type=click.Choice(logsetup.LEVELS),
    default="info",
    show_default=True,
    help="Least severe log lines written.",
)
@click.option(
    "--log-format",
    type=click.Choice(logsetup.FORMATS),
    default="text",
    show_default=True,
    help="Log lines as text, or one JSON object per line (for Loki, Elasticsearch).",
)
@config_option("HPCORCH_CONTROLLER_CONFIG")
def controller(
    reservation: str,
    nodes: str | None,
    users: str | None,
    partition: str | None,
    policy: str,
    interval: float,
    fast_interval: float,
    max_calls: float,
    round_s: float,
    restart_cost: float,
    grace: float,
    launch_pending: float,
    startup: float,
    max_retries: int,
    min_run: float,
    seed: int,
    pool_models_across_users: bool,
    mix_gpu_types: bool,
    lease_ttl: float,
    once: bool,
    spool: str | None,
    adopt: bool,
    state_dir: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run the controller: hold the pool, schedule its jobs, until SIGTERM."""
    logsetup.configure("hpcorch-controller", log_level, log_format)
    log = logging.getLogger("hpcorch.controller")
    directory = controller_dir(state_dir)
    spool_root = Path(spool).expanduser().resolve() if spool else directory / "jobs"
    with _lock(directory):
        try:
            store = Store(directory / STATE_DB)
            fresh = store.get_meta("reservation") is None and not store.jobs()
            _check_reservation(store, directory, reservation, adopt)
            _prepare_spool(directory, spool_root)
            cluster = SlurmCluster(reservation, spool=spool_root)
            version = check_supported(cluster.backend.version())
            cluster.backend.use(behaviour(version))
            log.info("Slurm %s (slurmctld), through %s", version, backend_name(cluster.backend))
            if reservation not in cluster.backend.reservations():
                nodes = pool_nodes(cluster, reservation, nodes, partition)
            if fresh:
                _check_fresh_state(cluster, directory, reservation, adopt)
            done = cluster.ensure_reservation(nodes or "", users or getpass.getuser(), partition)
        except HpcorchError as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:
            raise click.ClickException(f"cannot prepare {exc.filename}: {exc.strerror}") from exc
        store.set_meta("reservation", reservation)
        pool = cluster.reservation_nodes()
        log.info(
            "%s reservation '%s' (%d nodes: %s, all it holds); policy %s; state in %s; plans in %s",
            done,
            reservation,
            len(pool),
            ",".join(pool),
            policy,
            directory,
            spool_root,
        )
        if isinstance(cluster.backend, SlurmCLI):
            # every job's JSON read afresh once a round: a pin (`hpcorch resize`, a comment
            # change no signature shows) is seen by the next round
            cluster.backend.job_cache_age_s = round_s
        config = LoopConfig(
            interval_s=interval,
            fast_interval_s=fast_interval,
            max_calls_per_s=max_calls,
            round_s=round_s,
            restart_cost_s=restart_cost,
            mix_types=mix_gpu_types,
            # each command a process of its own, answered by slurmctld's threads; pyslurm's
            # library calls are made one at a time
            parallel_actions=1 if backend_name(cluster.backend) == "pyslurm" else PARALLEL_ACTIONS,
            settings=Settings(
                grace_s=grace,
                max_retries=max_retries,
                min_run_s=min_run,
                launch_pending_s=launch_pending,
                startup_s=startup,
            ),
        )
        chosen = make_policy(policy, seed)
        if pool_models_across_users:
            chosen = AcrossOwners(chosen)
        stop = threading.Event()

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("%s: stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        lease = Lease(cluster, ttl_s=lease_ttl)
        if not _hold_lease(lease, reservation, once, stop, min(interval, lease_ttl / 4)):
            store.close()
            return
        loop = Controller(cluster, store, chosen, config, lease=lease)
        queries = QueryServer(directory)  # users read the pool through <state>/query.sock
        queries.start()
        try:
            if once:
                loop.cycle()
            else:
                serve(loop, stop.is_set, stop.wait)
        except LeaseLost as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            queries.close()
            store.close()
            with suppress(HpcorchError):
                lease.release()


def _hold_lease(
    lease: Lease, reservation: str, once: bool, stop: threading.Event, every: float
) -> bool:
    """Take the pool's lease, standing by while another controller holds it (said once);
    False if told to stop first. ``once``: refuse instead of standing by."""
    log = logging.getLogger("hpcorch.controller")
    since = time.monotonic()
    said = ""
    while not stop.is_set():
        try:
            if lease.try_acquire():
                waited = time.monotonic() - since
                after = f" after standing by {waited:.0f} s" if said else ""
                log.info(
                    "holds the lease of pool '%s' (job %d)%s", reservation, lease.job_id, after
                )
                return True
            why = (
                f"{lease.describe_holder()} holds the lease of pool '{reservation}': standing "
                f"by; this one takes over if it stops renewing it for {lease.ttl_s:.0f} s"
            )
        except HpcorchError as exc:
            why = f"cannot read the pool's lease ({exc}): trying again"
        if once:
            raise click.ClickException(why.replace(": standing by;", ": not acting;"))
        if why.split(":")[0] != said.split(":")[0]:
            log.warning("%s", why)
            said = why
        stop.wait(every)
    return False


def _check_reservation(store: Store, directory: Path, reservation: str, adopt: bool) -> None:
    """Refuse a state directory kept for another reservation, unless told to adopt it: its
    jobs, not seen in this one, would all be marked lost."""
    kept = store.get_meta("reservation")
    if kept is None or kept == reservation:
        return
    if not adopt:
        raise HpcorchError(
            f"the state in {directory} belongs to reservation '{kept}', not '{reservation}': "
            f"run with --reservation {kept}, or add --adopt to take it over for "
            f"'{reservation}' (the jobs of '{kept}' are then marked lost)"
        )
    click.echo(
        f"hpcorch-controller: state of reservation '{kept}' taken over for '{reservation}'",
        err=True,
    )


def pool_nodes(
    cluster: SlurmCluster, reservation: str, nodes: str | None, partition: str | None
) -> str:
    """The nodes of a reservation the controller is to create: those named, or a count of
    idle GPU nodes of the partition outside other reservations. Never the whole partition
    unasked: other jobs may share it (admin guide, "Sharing a partition")."""
    if nodes is None:
        raise HpcorchError(
            f"reservation '{reservation}' does not exist: give --nodes, the nodes it is to "
            "hold (e.g. n[1-4]) or a count of idle ones (e.g. 4); the controller holds only "
            "those"
        )
    if not nodes.isdigit():
        return nodes
    want = int(nodes)
    if want < 1:
        raise HpcorchError(
            f"--nodes {nodes}: give the number of idle GPU nodes the reservation is to hold "
            "(at least 1), or name the nodes (e.g. n[1-4])"
        )
    part = partition or cluster.backend.partitions()[1]
    taken = {n for names in cluster.backend.reservations().values() for n in names}
    idle = [
        n.name
        for n in cluster.backend.nodes()
        if part in n.partitions and n.gpus and n.usable and not n.gpus_used
        and not n.cpus_used and n.name not in taken
    ]  # fmt: skip
    if len(idle) < want:
        raise HpcorchError(
            f"--nodes {want}: partition '{part}' has {len(idle)} idle GPU node(s) outside "
            f"other reservations ({','.join(idle) or 'none'}); name the nodes instead"
        )
    return ",".join(idle[:want])


def _check_fresh_state(
    cluster: SlurmCluster, directory: Path, reservation: str, adopt: bool
) -> None:
    """Refuse an empty (or missing, or zero-length) state beside a reservation that holds
    hpcorch jobs a controller already acted on, unless told to adopt them: the state that
    knew them is lost (the jobs it gave up on, its guards), and adopting them anew could
    start such a job again. Jobs submitted before the first start are simply adopted."""
    try:
        jobs = cluster.backend.jobs(reservation)
    except HpcorchError:
        return  # no such reservation (or Slurm cannot say): nothing to lose
    # jobs a controller already acted on: started (running, or requeued since), or under
    # its admin hold; a fresh submission (held by its owner, never run) needs no state
    ours = [
        j.job_id
        for j in jobs
        if j.reservation == reservation
        and parse_comment(j.comment) is not None
        and j.state not in ENDED_STATES
        and (j.state != "PENDING" or j.restarts > 0 or j.reason == "JobHeldAdmin")
    ]
    if not ours:
        return
    shown = ", ".join(str(i) for i in sorted(ours)[:5]) + (", ..." if len(ours) > 5 else "")
    if not adopt:
        raise HpcorchError(
            f"the state in {directory} is empty, but reservation '{reservation}' holds "
            f"{len(ours)} hpcorch job(s) ({shown}): restore {directory / STATE_DB} from a "
            "backup, or add --adopt to take them over as new jobs (a job the lost state had "
            "given up on may then start again)"
        )
    click.echo(
        f"hpcorch-controller: empty state: {len(ours)} hpcorch job(s) of '{reservation}' "
        f"adopted as new ({shown})",
        err=True,
    )


def _prepare_spool(directory: Path, spool: Path) -> None:
    """Create the spool; a spool inside the state directory needs the directory
    searchable (not readable) by the jobs' owners."""
    if spool.is_relative_to(directory) and directory.stat().st_uid == os.geteuid():
        os.chmod(directory, directory.stat().st_mode & 0o7777 | 0o011)
    Spool(spool).ensure()
    for d in (spool, *spool.parents):
        if not d.stat().st_mode & 0o001:
            click.echo(
                f"hpcorch-controller: warning: {d} is not searchable by others: jobs of other "
                f"users cannot read their plans in {spool}",
                err=True,
            )
            break
