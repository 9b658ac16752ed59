"""The one IO seam to Slurm: the ``SlurmBackend`` interface and ``SlurmCLI``, which drives
sbatch/squeue/sinfo/scontrol/scancel.

Every call is one subprocess with an argument list (never a shell), a timeout, and a
one-line error naming the command and Slurm's own message. The other backend,
``PySlurmBackend`` (hpcorch/slurm/pyslurm_backend.py), talks to slurmctld through pyslurm;
``hpcorch.slurm.factory.make_backend`` picks one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from hpcorch import hostlist
from hpcorch.cluster import LEASE_NAME, LEASE_TAG
from hpcorch.errors import SlurmCommandError, SlurmTimeout, SlurmUnavailable
from hpcorch.slurm.assoc_mgr import (
    AssocMgr,
    AssocMgrError,
    Partition,
    parse_assoc_mgr,
    parse_partitions,
)
from hpcorch.slurm.cli_errors import check_slurm_conf, first_error_line, unreachable
from hpcorch.slurm.clock import CallClock
from hpcorch.slurm.options import without_sbatch_env
from hpcorch.slurm.parse import (
    SACCT_FIELDS,
    SlurmJob,
    SlurmNode,
    SlurmReservation,
    parse_nodes,
    parse_reservation,
    parse_sacct,
    parse_squeue,
    parse_sshare,
)
from hpcorch.slurm.shape_args import shape_args
from hpcorch.slurm.squeue_cache import MAX_AGE_S, SIGNATURE_ARGV, JobCache
from hpcorch.slurm.version import SlurmBehaviour, SlurmVersion, parse_version

RESERVATION_DURATION = "3650-00:00:00"
"""How long a new reservation lasts: ten years, renewed by the controller long before it
ends. Slurm 22.05 turns Duration=infinite into 365 days, and refuses 100 years."""


class SlurmBackend(Protocol):
    """What hpcorch needs from Slurm. Failures raise ``SlurmCommandError`` carrying
    Slurm's own message, or ``SlurmUnavailable`` when slurmctld cannot be reached."""

    @property
    def calls(self) -> int:
        """Requests sent to Slurm so far (commands run or RPCs made)."""
        ...

    @property
    def seconds(self) -> float:
        """Seconds spent waiting for Slurm's answers so far."""
        ...

    def longest_call(self) -> float:
        """Seconds of the longest single request since this was last asked (0: none)."""
        ...

    def ping(self) -> None:
        """One cheap request (``scontrol ping``): ``SlurmUnavailable`` unless slurmctld
        answers."""
        ...

    # queries
    def version(self) -> SlurmVersion:
        """The release slurmctld runs (not the commands': they may be older)."""
        ...

    def use(self, behaviour: SlurmBehaviour) -> None:
        """Talk to Slurm as ``behaviour``'s release expects (after :meth:`version`)."""
        ...

    def jobs(self, reservation: str | None = None) -> list[SlurmJob]:
        """Every job Slurm knows, or only those of ``reservation``."""
        ...

    def nodes(self) -> list[SlurmNode]: ...
    def partitions(self) -> tuple[list[str], str | None]: ...
    def reservations(self) -> dict[str, list[str]]: ...
    def reservation_nodes(self, name: str) -> list[str]:
        """The nodes of reservation ``name`` ([] if it has none); an error naming
        "not found" if there is no such reservation."""
        ...

    def reservation(self, name: str) -> SlurmReservation:
        """Reservation ``name``; an error naming "not found" if there is none."""
        ...

    def reservation_list(self) -> list[SlurmReservation]:
        """Every reservation Slurm holds (one call)."""
        ...

    def fair_shares(self) -> dict[str, float]:
        """User -> Slurm's FairShare factor (0..1); empty without accounting."""
        ...

    def accounting_jobs(self, job_ids: Sequence[int]) -> list[SlurmJob]:
        """Jobs from Slurm's accounting (sacct), for ids squeue no longer lists; [] when
        accounting is not enabled."""
        ...

    def limits(self, users: Sequence[str] = ()) -> tuple[AssocMgr, dict[str, Partition]]:
        """slurmctld's associations and QOS, with their limits and what it counts against
        them (of ``users`` and every account; none without accounting), and the
        partitions' limits."""
        ...

    # actions
    def submit(self, script: str, args: Sequence[str] = ()) -> int: ...
    def cancel(self, job_id: int, signal: str | None = None, batch_only: bool = False) -> None: ...
    def set_shape(
        self,
        job_id: int,
        nodes: int,
        gpus_per_node: int,
        node_names: Sequence[str] = (),
        cpus_per_gpu: int = 0,
        per_node: Sequence[int] = (),
        gpu_type: str = "",
        time_limit_min: int = 0,
        start_now: bool = False,
    ) -> None:
        """Exactly ``nodes`` nodes with ``gpus_per_node`` GPUs each, on ``node_names`` if
        given (an empty list clears a previous node list), with ``cpus_per_gpu`` CPUs per
        GPU if given. ``per_node``: GPUs on each of ``node_names`` when they differ (see
        :func:`shape_args`). ``gpu_type``: GPUs of that type only ('': any).
        ``time_limit_min``: the launch's time limit in minutes (-1: UNLIMITED; 0: as it
        is). ``start_now``: in the same request, let it start at once (StartTime=now)."""
        ...

    def start_now(self, job_id: int) -> None:
        """Let a pending job start at once (StartTime=now)."""
        ...

    def set_comment(self, job_id: int, comment: str) -> None: ...
    def allow_requeue(self, job_id: int) -> None:
        """Let Slurm requeue the job again (``Requeue=1``)."""
        ...

    def hold(self, job_id: int) -> None: ...
    def release(self, job_id: int) -> None: ...
    def set_held(self, job_ids: Sequence[int], held: bool) -> None:
        """Hold (``held``) or release every one of ``job_ids``, in one request where Slurm
        takes a list; an error is raised once all were tried."""
        ...

    def requeue_hold(self, job_id: int) -> None: ...
    def create_reservation(
        self, name: str, nodes: str, users: str, partition: str | None = None
    ) -> None:
        """A reservation of ``nodes`` for ``users`` that ignores running jobs and lasts
        ``RESERVATION_DURATION`` (the controller extends it before it ends)."""
        ...

    def extend_reservation(self, name: str, end_time: float) -> None:
        """Move the end of reservation ``name`` to ``end_time`` (Unix time)."""
        ...


def tolerate(action: Callable[[int], None], slurm_id: int, ok: Sequence[str]) -> None:
    """``action(slurm_id)``, where a Slurm error that says one of ``ok`` (lower case) means
    there is nothing left to do."""
    try:
        action(slurm_id)
    except SlurmCommandError as exc:
        if not any(s in str(exc).lower() for s in ok):
            raise


class SlurmCLI:
    """Slurm through its command-line tools (works with 22.05 through 25.11)."""

    def __init__(self, timeout: float = 30.0, env: Mapping[str, str] | None = None) -> None:
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        self.calls = 0
        """Slurm commands run by this backend (for metrics and tests)."""
        self._count = threading.Lock()  # commands may run from several threads at once
        self.clock = CallClock()
        """How long those commands took."""
        self._nodes_argv = ["sinfo", "--json"]
        self._typed = True
        """A launch's GPU request names its type (see ``SlurmBehaviour.retypes_gpus``)."""
        self._caches: dict[str, JobCache] = {}
        self.job_cache_age_s = MAX_AGE_S
        """Every job's JSON read again at least this often (``JobCache``)."""
        self.uid = os.geteuid()
        """Whose jobs outside the reservation may be lease jobs: this process's user."""

    # --- plumbing -----------------------------------------------------------------------
    def run(
        self, argv: Sequence[str], stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        """Run one Slurm command; its stdout, or a SlurmCommandError/SlurmUnavailable.
        ``env``: the command's environment instead of the backend's."""
        exe = shutil.which(argv[0], path=self.env.get("PATH"))
        if exe is None:
            raise SlurmUnavailable(f"{argv[0]} not found: is Slurm installed and on PATH?")
        check_slurm_conf(self.env)
        with self._count:
            self.calls += 1
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [exe, *argv[1:]],
                input=stdin,
                capture_output=True,
                encoding="utf-8",
                errors="replace",  # a binary slurm.conf makes Slurm echo its bytes
                timeout=self.timeout,
                env=dict(self.env if env is None else env),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            self.clock.took(time.monotonic() - t0)
            if argv[:2] != ["scontrol", "ping"] and self._answers():
                # slurmctld answers: the command itself waited (scancel retries a job in a
                # transition for up to 95 s): this command failed, Slurm is not down
                raise SlurmTimeout(
                    f"{argv[0]} did not finish within {self.timeout:.0f} s (slurmctld "
                    "answers: the command kept waiting)"
                ) from exc
            raise SlurmUnavailable(
                f"{argv[0]} did not answer within {self.timeout:.0f} s: is slurmctld up?"
            ) from exc
        else:
            self.clock.took(time.monotonic() - t0)
        if proc.returncode != 0:
            msg = (
                first_error_line(proc.stderr)
                or first_error_line(proc.stdout)
                or f"exit code {proc.returncode}"
            )
            if unreachable(proc.stderr):
                raise SlurmUnavailable(f"Slurm is not reachable ({argv[0]}: {msg})")
            raise SlurmCommandError(f"{argv[0]} failed: {msg}")
        return proc.stdout

    def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        out = self.run(argv)
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmCommandError(f"{argv[0]} --json printed no valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise SlurmCommandError(f"{argv[0]} --json printed {type(doc).__name__}, not object")
        errors = doc.get("errors")
        if isinstance(errors, list) and errors:
            # Slurm 22.05's squeue and sinfo exit 0 with an empty list and this when
            # slurmctld does not answer: never "no jobs" (every job would look gone)
            first = errors[0] if isinstance(errors[0], dict) else {}
            what = ": ".join(
                str(first[k]) for k in ("source", "description", "error") if first.get(k)
            )
            raise SlurmUnavailable(
                f"Slurm is not reachable ({argv[0]} --json answered with an error instead "
                f"of its list: {what or 'no detail'})"
            )
        return doc

    # --- queries ------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        out = self.run(["scontrol", "show", "config"])
        try:
            return parse_version(out)
        except ValueError as exc:
            raise SlurmCommandError(f"scontrol show config names no Slurm version: {exc}") from exc

    def use(self, behaviour: SlurmBehaviour) -> None:
        self._nodes_argv = (
            ["scontrol", "show", "nodes", "--json"]
            if behaviour.nodes_from_scontrol
            else ["sinfo", "--json"]
        )
        self._typed = behaviour.retypes_gpus

    def jobs(self, reservation: str | None = None) -> list[SlurmJob]:
        """Every job slurmctld knows, or only ``reservation``'s and this user's lease jobs
        (read through ``JobCache``: a text signature of every job each time, the JSON of
        those that changed). From 24.05 on, ``squeue --json`` lists only pending and
        running jobs unless asked for every state: a job that has just ended is in the
        answer only with ``--states=all``."""
        if reservation is None:
            return parse_squeue(self._squeue_json(None))
        cache = self._caches.get(reservation)
        if cache is None:
            cache = self._caches[reservation] = JobCache(
                reservation,
                self._squeue_json,
                lambda: self.run(SIGNATURE_ARGV),
                self.uid,
                volatile=_lease_like,
            )
        cache.max_age_s = self.job_cache_age_s  # (set after the first read: the controller's round)
        return cache.jobs()

    def _squeue_json(self, job_ids: Sequence[int] | None) -> dict[str, Any]:
        """``squeue --json`` of these jobs (22.05 ignores the filter: every job), or all."""
        ids = [f"--jobs={','.join(str(j) for j in job_ids)}"] if job_ids else []
        return self._json(["squeue", "--json", "--states=all", *ids])

    def _forget(self, job_ids: Sequence[int]) -> None:
        """Jobs this backend acted on: read afresh at the next ``jobs``."""
        for cache in list(self._caches.values()):
            cache.forget(job_ids)

    def nodes(self) -> list[SlurmNode]:
        doc = self._json(self._nodes_argv)
        if "nodes" not in doc:  # 23.11+ groups sinfo output; scontrol has the flat list
            self._nodes_argv = ["scontrol", "show", "nodes", "--json"]  # from now on
            doc = self._json(self._nodes_argv)
        return parse_nodes(doc)

    def partitions(self) -> tuple[list[str], str | None]:
        """Partition names, and the default partition (None if there is none)."""
        out = self.run(["sinfo", "-h", "-o", "%P"])
        raw = {line.strip() for line in out.splitlines() if line.strip()}
        default = next((p.rstrip("*") for p in raw if p.endswith("*")), None)
        return sorted(p.rstrip("*") for p in raw), default

    def reservations(self) -> dict[str, list[str]]:
        """Reservation name -> its node names."""
        out = self.run(["scontrol", "-o", "show", "reservation"])
        found: dict[str, list[str]] = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            name = fields.get("ReservationName")
            if name:
                nodes = fields.get("Nodes", "")
                found[name] = expand_nodelist(nodes) if nodes not in ("", "(null)") else []
        return found

    def reservation_list(self) -> list[SlurmReservation]:
        out = self.run(["scontrol", "-o", "show", "reservation"])
        return [r for r in map(parse_reservation, out.splitlines()) if r is not None]

    def reservation(self, name: str) -> SlurmReservation:
        out = self.scontrol("-o", "show", "reservation", name)
        for line in out.splitlines():
            found = parse_reservation(line)
            if found is not None and found.name == name:
                return found
        raise SlurmCommandError(f"scontrol failed: reservation {name} not found")

    def accounting_jobs(self, job_ids: Sequence[int]) -> list[SlurmJob]:
        if not job_ids:
            return []
        ids = ",".join(str(int(i)) for i in sorted(set(job_ids)))
        try:
            out = self.run(["sacct", "-X", "-P", "-n", "-j", ids, "-o", SACCT_FIELDS])
        except SlurmCommandError as exc:
            if "accounting" in str(exc).lower() and "disabled" in str(exc).lower():
                return []  # no slurmdbd: squeue is all there is
            raise
        return parse_sacct(out)

    def fair_shares(self) -> dict[str, float]:
        return parse_sshare(self.run(["sshare", "-a", "-n", "-P", "-o", "User,FairShare"]))

    def limits(self, users: Sequence[str] = ()) -> tuple[AssocMgr, dict[str, Partition]]:
        parts = parse_partitions(self.run(["scontrol", "-o", "show", "partition"]))
        argv = ["scontrol", "show", "assoc_mgr", "flags=users,assoc,qos"]
        if users:
            argv.append("users=" + ",".join(sorted(set(users))))
        try:
            return parse_assoc_mgr(self.run(argv)), parts
        except (SlurmCommandError, AssocMgrError):  # no accounting: no associations
            return AssocMgr(), parts

    def reservation_nodes(self, name: str) -> list[str]:
        nodes = self.reservation(name).nodes
        return expand_nodelist(nodes) if nodes else []

    @property
    def seconds(self) -> float:
        """Seconds spent in its commands."""
        return self.clock.seconds

    def longest_call(self) -> float:
        return self.clock.longest_call()

    def _answers(self) -> bool:
        """Whether slurmctld answers one ping (after a command ran out of time)."""
        try:
            self.ping()
        except (SlurmUnavailable, SlurmCommandError):
            return False
        return True

    def ping(self) -> None:
        """Raise SlurmUnavailable unless slurmctld answers."""
        out = self.run(["scontrol", "ping"])
        if "UP" not in out:
            raise SlurmUnavailable(f"slurmctld is not up: {out.strip()}")

    # --- actions ------------------------------------------------------------------------
    def submit(self, script: str, args: Sequence[str] = ()) -> int:
        """sbatch a script given as text; extra sbatch options in ``args``. Returns job id.

        sbatch runs without the ``SBATCH_*`` variables of this environment: they would
        override the script's ``#SBATCH`` lines, which carry every option of the job
        (hpcorch/slurm/options.py takes the useful ones as defaults instead)."""
        env = without_sbatch_env(self.env)
        out = self.run(["sbatch", "--parsable", *args], stdin=script, env=env)
        first = out.strip().split(";")[0]
        if not first.isdigit():
            raise SlurmCommandError(f"sbatch printed no job id: {out.strip()!r}")
        return int(first)

    def cancel(self, job_id: int, signal: str | None = None, batch_only: bool = False) -> None:
        argv = ["scancel"]
        if signal:
            argv.append(f"--signal={signal}")
        if batch_only:
            argv.append("--batch")
        try:
            self.run([*argv, str(job_id)])
        finally:
            self._forget([job_id])

    def set_shape(
        self,
        job_id: int,
        nodes: int,
        gpus_per_node: int,
        node_names: Sequence[str] = (),
        cpus_per_gpu: int = 0,
        per_node: Sequence[int] = (),
        gpu_type: str = "",
        time_limit_min: int = 0,
        start_now: bool = False,
    ) -> None:
        if node_names and not self._typed:  # 22.05: the nodes name the type (retypes_gpus)
            gpu_type = ""
        fields = shape_args(nodes, gpus_per_node, node_names, cpus_per_gpu, per_node, gpu_type)
        if time_limit_min:
            fields.append(f"TimeLimit={time_limit_min if time_limit_min > 0 else 'UNLIMITED'}")
        if start_now:
            fields.append("StartTime=now")
        try:
            self.scontrol("update", f"jobid={job_id}", *fields)
        except SlurmCommandError as exc:
            if MIXED_GRES not in str(exc):
                raise
            # Slurm checks a job's old GPU request with the new one: typed after untyped
            # (or back) in one update is "Invalid GRES specification (with and without
            # type identification)" (22.05 to 25.11). Cleared first, the new one is taken.
            self.scontrol("update", f"jobid={job_id}", "TresPerNode=", "TresPerJob=")
            self.scontrol("update", f"jobid={job_id}", *fields)

    def start_now(self, job_id: int) -> None:
        self.scontrol("update", f"jobid={job_id}", "StartTime=now")

    def set_comment(self, job_id: int, comment: str) -> None:
        self.scontrol("update", f"jobid={job_id}", f"Comment={comment}")

    def allow_requeue(self, job_id: int) -> None:
        self.scontrol("update", f"jobid={job_id}", "Requeue=1")

    def hold(self, job_id: int) -> None:
        self.scontrol("hold", str(job_id))

    def release(self, job_id: int) -> None:
        self.scontrol("release", str(job_id))

    def set_held(self, job_ids: Sequence[int], held: bool) -> None:
        # scontrol tries every job of the list and exits 1 if one failed
        self.scontrol("hold" if held else "release", ",".join(str(j) for j in job_ids))

    def requeue_hold(self, job_id: int) -> None:
        self.scontrol("requeuehold", str(job_id))

    def create_reservation(
        self, name: str, nodes: str, users: str, partition: str | None = None
    ) -> None:
        args = [
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={nodes}",
            f"Users={users}",
            "StartTime=now",
            f"Duration={RESERVATION_DURATION}",
            "Flags=IGNORE_JOBS",
        ]
        if partition:
            args.append(f"PartitionName={partition}")
        self.scontrol(*args)

    def extend_reservation(self, name: str, end_time: float) -> None:
        end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end_time))
        self.scontrol("update", f"ReservationName={name}", f"EndTime={end}")

    def scontrol(self, *args: str) -> str:
        """Any scontrol command (arguments as a list, never through a shell). A job it
        updates, holds, releases or requeues is read afresh at the next ``jobs``."""
        try:
            return self.run(["scontrol", *args])
        finally:
            if len(args) >= 2 and args[0] in JOB_VERBS:
                target = args[1].removeprefix("jobid=") if args[0] == "update" else args[1]
                self._forget([int(j) for j in target.split(",") if j.isdigit()])


def _lease_like(job: SlurmJob) -> bool:
    """A lease job (hpcorch/slurm/lease_jobs.py): read afresh every time."""
    return job.name == LEASE_NAME or job.comment.startswith(LEASE_TAG)


JOB_VERBS = frozenset({"update", "hold", "release", "requeuehold", "requeue", "uhold"})
"""scontrol verbs that change a job (their second argument names it)."""
MIXED_GRES = "with and without type identification"
"""What slurmctld says of a GPU request updated from untyped to typed (or back) at once."""


def expand_nodelist(nodelist: str) -> list[str]:
    """``gpu-a[001-002],rack[1-2]-n01`` -> every node name (``hpcorch.hostlist.expand``);
    raises ``HostlistError`` (a ValueError) for a list Slurm would not print."""
    return hostlist.expand(nodelist)
