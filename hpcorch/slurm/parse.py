"""Parse ``squeue --json`` and ``sinfo --json`` across Slurm versions. Pure functions.

Slurm 22.05 emits OpenAPI v0.0.38 shapes: plain strings and integers. 23.02 (v0.0.39)
wraps numbers in ``{"set": true, "infinite": false, "number": 5}``, the exit code
included (still a wait(2) status). From 23.11 (v0.0.40, v0.0.41 in 24.05) states are
lists (``["RUNNING"]``), exit codes are ``{"status": [...], "return_code": {...},
"signal": {...}}`` and jobs carry a ``hold`` flag (24.05). Every accessor here accepts
all of them; ``tests/fixtures/`` holds one document per version.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcorch.cluster import LEASE_NAME

_GPU_RE = re.compile(r"(?:^|[,/])(?:gres[:/])?gpu(?::[A-Za-z0-9_.-]+)?[:=](\d+)")


def _num(value: Any, default: int = 0) -> int:
    """An integer from a plain number or a 23.11+ ``{"set","infinite","number"}`` dict."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return default
        return _num(value.get("number", default), default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


def job_id_of(raw: Mapping[str, Any]) -> int:
    """The job id of one ``squeue --json`` job (0: none)."""
    return _num(raw.get("job_id"))


def _states(value: Any) -> tuple[str, ...]:
    """Job or node state(s): ``"RUNNING"``, ``"mixed"`` or ``["IDLE", "DRAIN"]``."""
    if isinstance(value, str):
        states = [s for s in value.upper().replace("+", " ").split() if s]
        if any(s.endswith("*") for s in states):  # sinfo's "down*": not responding
            states = [s.rstrip("*") for s in states] + ["NOT_RESPONDING"]
        return tuple(states)
    if isinstance(value, Sequence):
        return tuple(str(s).upper() for s in value)
    return ()


def _exit_code(value: Any) -> int:
    if isinstance(value, Mapping) and ("return_code" in value or "status" in value):
        rc = value.get("return_code", 0)
        signal = value.get("signal", {})
        if isinstance(signal, Mapping) and _num(signal.get("id"), 0):
            return 128 + _num(signal.get("id"), 0)
        return _num(rc, 0)
    # 22.05 (plain) and 23.02 ({"set", "number"}) report the raw wait(2) status: exit code
    # in the high byte, signal in the low
    status = _num(value, 0)
    if status & 0x7F:
        return 128 + (status & 0x7F)
    return (status >> 8) & 0xFF


_GPU_TYPE_RE = re.compile(r"(?:^|[,\s])(?:gres[:/])?gpu:([A-Za-z][A-Za-z0-9_.-]{0,31}):\d")


def gpu_type_in(gres: str | None) -> str:
    """The GPU type a node's GRES names (``gpu:a100:4(S:0)`` -> ``a100``); "" for untyped
    GPUs (``gpu:4``); the first type when a node has several."""
    found = _GPU_TYPE_RE.search(gres or "")
    return found.group(1) if found else ""


def gpus_in(tres: str | None) -> int:
    """GPUs named in a TRES/GRES string such as ``gres:gpu:4`` or ``cpu=2,gres/gpu=4``."""
    if not tres:
        return 0
    return sum(int(m.group(1)) for m in _GPU_RE.finditer(tres))


@dataclass(frozen=True)
class SlurmJob:
    """One job as squeue reports it."""

    job_id: int
    name: str
    user: str
    state: str
    """Primary state, e.g. PENDING, RUNNING, COMPLETED, FAILED."""
    reason: str
    partition: str
    nodes: str
    node_count: int
    gpus_per_node: int
    comment: str
    submit_time: int
    start_time: int
    end_time: int
    time_limit_min: int
    restarts: int
    exit_code: int
    work_dir: str
    reservation: str
    held: bool
    uid: int = -1
    """The owner's Unix user id (-1: not reported)."""
    gpus_by_node: tuple[int, ...] = ()
    """GPUs allocated on each node of ``nodes`` (Slurm's node order), while it holds them."""
    gpus_per_job: int = 0
    """A GPU count for the whole job (``--gpus``), 0 when it asked per node."""
    cpus_per_gpu: int = 0
    """CPUs per GPU it asked for (``--cpus-per-gpu``), 0 when not given."""
    account: str = ""
    qos: str = ""
    cpus: int = 0
    """CPUs allocated (or asked for, while pending) over all its nodes."""
    special_exit: bool = False
    """Requeued held in Slurm's SPECIAL_EXIT state: what hpcorch's job wrapper does to its
    job after a checkpoint on request (``requeuehold State=SpecialExit``)."""
    batch: bool = True
    """A batch job (sbatch); False for an interactive allocation (salloc, srun)."""
    requeue: bool = True
    """Slurm may requeue it (False: ``--no-requeue`` or ``scontrol update Requeue=0``)."""

    @property
    def gpus(self) -> int:
        if self.gpus_by_node:
            return sum(self.gpus_by_node)
        return self.gpus_per_job or self.gpus_per_node * self.node_count


SLURM_DRAIN_REASONS = (
    "Kill task failed",
    "Duplicate jobid",
    "Prolog error",
    "Epilog error",
    "Prolog/Epilog failure",
    "Job env setup error",
    "batch job complete failure",
    "Low RealMemory",
    "Low TmpDisk",
    "Low socket*core*thread count",
    "Low CPUs",
    "Node unexpectedly rebooted",
    "gres/",
)
"""How the reasons begin that Slurm's daemons give the nodes they drain themselves (the
rest are an admin's)."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as sinfo reports it."""

    name: str
    address: str
    states: tuple[str, ...]
    partitions: tuple[str, ...]
    cpus: int
    gpus: int
    gpus_used: int
    reason: str
    cpus_used: int = 0
    gpu_type: str = ""
    """The type its GRES names (``Gres=gpu:a100:4``), "" when its GPUs are untyped."""

    @property
    def leaving(self) -> str:
        """Why the node is being emptied while it still runs jobs: an admin drains it
        (``scontrol update state=drain``), or Slurm does (``SLURM_DRAIN_REASONS``), or a
        reboot waits for it to be empty (``scontrol reboot ASAP``); '' when it is not, or
        when it has failed (down, not responding: Slurm requeues its jobs itself)."""
        states = set(self.states)
        if states & {"DOWN", "NOT_RESPONDING", "POWERED_DOWN", "FUTURE"}:
            return ""
        said = "".join(c if c.isprintable() else "?" for c in self.reason[:120])
        why = f" (Reason={said})" if said else ""
        if states & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}:
            return f"a reboot is pending{why}"
        if states & {"DRAIN", "DRAINING", "DRAINED", "FAILING"}:
            by = "Slurm" if self.reason.startswith(SLURM_DRAIN_REASONS) else "an admin"
            return f"drained by {by}{why}"
        return ""

    @property
    def usable(self) -> bool:
        """Up and schedulable (not down, drained, failing or not responding)."""
        bad = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING"}
        bad |= {"INVAL", "UNKNOWN", "POWERED_DOWN", "FUTURE", "MAINTENANCE", "REBOOT_ISSUED"}
        return bool(self.states) and not (set(self.states) & bad)


# Flag states that Slurm may report in place of a job's base state, and that base state
FLAG_STATES = {
    "REQUEUE_HOLD": "PENDING",
    "REQUEUED": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "SPECIAL_EXIT": "PENDING",
    "RESIZING": "RUNNING",
    "SIGNALING": "RUNNING",
    "STAGE_OUT": "COMPLETING",
}
HELD_FLAGS = frozenset({"REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"})


def _base_states(raw_states: tuple[str, ...]) -> tuple[str, ...]:
    """Base state first: ("REQUEUE_HOLD",) -> ("PENDING", "REQUEUE_HOLD")."""
    if not raw_states or raw_states[0] not in FLAG_STATES:
        return raw_states
    base = FLAG_STATES[raw_states[0]]
    rest = tuple(x for x in raw_states if x != base)
    return (base, *rest)


def _tres(value: Any) -> str:
    if isinstance(value, str):
        return value
    return ",".join(str(t) for t in value) if isinstance(value, Sequence) else ""


def gpus_by_node(detail: Any) -> tuple[int, ...]:
    """GPUs per node from a job's ``gres_detail`` (one string per allocated node, e.g.
    ``gpu:4(IDX:0-3)`` or ``gpu:a100:2(IDX:0-1),mps:50``)."""
    if not isinstance(detail, Sequence) or isinstance(detail, str):
        return ()
    return tuple(gpus_in(str(d)) for d in detail)


INFINITE32 = 0xFFFFFFFE
"""Slurm's INFINITE in a 32-bit field (what 22.05's JSON prints for no time limit)."""


def _time_limit(value: Any) -> int:
    """Minutes of a job's time limit; 0 for none (UNLIMITED, or not set)."""
    minutes = _num(value, 0)
    return 0 if minutes >= INFINITE32 or minutes < 0 else minutes


def _job(raw: Mapping[str, Any]) -> SlurmJob:
    states = _base_states(_states(raw.get("job_state")))
    tres = _tres(raw.get("tres_per_node"))
    node_count = _num(raw.get("node_count"), 0)
    if not node_count and isinstance(raw.get("nodes"), str) and raw["nodes"]:
        node_count = 1
    reason = str(raw.get("state_reason") or "")
    priority = _num(raw.get("priority"), 1)
    hold = raw.get("hold")
    held = hold if isinstance(hold, bool) else priority == 0
    held = held or bool(HELD_FLAGS & set(states))
    return SlurmJob(
        job_id=_num(raw.get("job_id")),
        name=str(raw.get("name") or ""),
        user=str(raw.get("user_name") or raw.get("user_id") or ""),
        state=states[0] if states else "UNKNOWN",
        reason="None" if reason in ("", "None") else reason,
        partition=str(raw.get("partition") or ""),
        nodes=str(raw.get("nodes") or ""),
        node_count=node_count,
        gpus_per_node=gpus_in(tres),
        comment=str(raw.get("comment") or ""),
        submit_time=_num(raw.get("submit_time")),
        start_time=_num(raw.get("start_time")),
        end_time=_num(raw.get("end_time")),
        time_limit_min=_time_limit(raw.get("time_limit")),
        restarts=_num(raw.get("restart_cnt")),
        exit_code=_exit_code(raw.get("exit_code")),
        work_dir=str(raw.get("current_working_directory") or ""),
        reservation=str(raw.get("resv_name") or ""),
        held=held and "PENDING" in states,
        special_exit="SPECIAL_EXIT" in states,
        uid=_num(raw.get("user_id"), -1),
        gpus_by_node=gpus_by_node(raw.get("gres_detail")),
        gpus_per_job=gpus_in(_tres(raw.get("tres_per_job"))),
        cpus_per_gpu=gpus_in(_tres(raw.get("cpus_per_tres"))),
        account=str(raw.get("account") or ""),
        qos=str(raw.get("qos") or ""),
        cpus=_num(raw.get("cpus")),
        batch=_flag(raw.get("batch_flag"), True),
        requeue=_flag(raw.get("requeue"), True),
    )


def _flag(value: Any, default: bool) -> bool:
    """A boolean field: true/false, 0/1, or absent (``default``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value)
    return default


def parse_squeue(doc: Mapping[str, Any], reservation: str | None = None) -> list[SlurmJob]:
    """Jobs from a ``squeue --json`` document (any supported version); only those of
    ``reservation`` when given, and lease jobs (a site's queue holds many other jobs: they
    are not parsed)."""
    jobs = [j for j in doc.get("jobs", []) if isinstance(j, Mapping)]
    if reservation is not None:
        jobs = [j for j in jobs if j.get("resv_name") == reservation or j.get("name") == LEASE_NAME]
    return [_job(j) for j in jobs]


def _node(raw: Mapping[str, Any]) -> SlurmNode:
    states = _states(raw.get("state")) + _states(raw.get("state_flags"))
    parts = raw.get("partitions") or []
    if isinstance(parts, str):
        parts = parts.split(",")
    return SlurmNode(
        name=str(raw.get("name") or raw.get("hostname") or ""),
        address=str(raw.get("address") or ""),
        states=states,
        partitions=tuple(str(p) for p in parts),
        cpus=_num(raw.get("cpus")),
        gpus=gpus_in(str(raw.get("gres") or "")),
        gpus_used=gpus_in(str(raw.get("gres_used") or "")),
        reason=str(raw.get("reason") or ""),
        cpus_used=_num(raw.get("alloc_cpus")),
        gpu_type=gpu_type_in(str(raw.get("gres") or "")),
    )


def parse_nodes(doc: Mapping[str, Any]) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` (22.05) or ``scontrol show nodes --json`` (23.02+)."""
    return [_node(n) for n in doc.get("nodes") or [] if isinstance(n, Mapping)]


@dataclass(frozen=True)
class SlurmReservation:
    """One reservation as ``scontrol -o show reservation`` prints it."""

    name: str
    nodes: str
    """Slurm's hostlist (empty if the reservation has no nodes)."""
    end_time: float
    """Unix time it ends (0: unknown)."""
    flags: tuple[str, ...]
    users: str
    start_time: float = 0.0
    """Unix time it starts (0: unknown)."""


def parse_sshare(text: str) -> dict[str, float]:
    """User -> FairShare factor from ``sshare -a -n -P -o User,FairShare`` (the largest
    of a user's associations; account lines, with no user, are skipped). Empty when
    every factor is 0: Slurm's priority/basic computes none."""
    shares: dict[str, float] = {}
    for line in text.splitlines():
        user, _, value = line.strip().partition("|")
        try:
            factor = float(value)
        except ValueError:
            continue
        if user and 0.0 <= factor <= 1.0:
            shares[user] = max(shares.get(user, 0.0), factor)
    if not any(shares.values()):
        return {}  # priority/basic computes no fair share: every factor reads 0
    return shares


def slurm_time(text: str) -> float:
    """Unix time of Slurm's local ``YYYY-MM-DDTHH:MM:SS`` (0 for Unknown, None, ...)."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return 0.0


def parse_reservation(line: str) -> SlurmReservation | None:
    """A reservation from one line of ``scontrol -o show reservation`` (None if the line
    names none)."""
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    name = fields.get("ReservationName")
    if not name:
        return None
    nodes = fields.get("Nodes", "")
    flags = fields.get("Flags", "")
    return SlurmReservation(
        name=name,
        nodes="" if nodes == "(null)" else nodes,
        end_time=slurm_time(fields.get("EndTime", "")),
        flags=tuple(f for f in flags.split(",") if f and f != "(null)"),
        users="" if fields.get("Users") == "(null)" else fields.get("Users", ""),
        start_time=slurm_time(fields.get("StartTime", "")),
    )


SACCT_FIELDS = (
    "JobID,JobName,User,State,Partition,Reservation,NodeList,NNodes,AllocTRES,Submit,Start,End,"
    "TimelimitRaw,ExitCode,WorkDir,Account,QOS,Comment"
)
"""``sacct -o`` fields ``parse_sacct`` reads (the comment last: it may hold anything)."""


def parse_sacct(text: str) -> list[SlurmJob]:
    """Jobs from ``sacct -X -P -n -o SACCT_FIELDS`` (jobs squeue no longer lists)."""
    jobs: list[SlurmJob] = []
    width = SACCT_FIELDS.count(",")
    for line in text.splitlines():
        cols = line.split("|", width)
        if len(cols) != width + 1 or not cols[0].isdigit():
            continue  # array or het job ids (123_4, 123+0) are not hpcorch's
        (jid, name, user, state, part, resv, nodes, nnodes, tres, sub, start, end) = cols[:12]
        limit, exit_code, work_dir, account, qos, comment = cols[12:]
        code, _, sig = exit_code.partition(":")
        count = _num(nnodes, 0)
        gpus = sum(int(m) for m in re.findall(r"gres/gpu(?::[^=,]+)?=(\d+)", tres))
        jobs.append(
            SlurmJob(
                job_id=int(jid),
                name=name,
                user=user,
                state=(state.split() or ["UNKNOWN"])[0],
                reason="None",
                partition=part,
                nodes="" if nodes in ("None assigned", "(null)") else nodes,
                node_count=count,
                gpus_per_node=gpus // count if count else 0,
                comment=comment,
                submit_time=int(slurm_time(sub)),
                start_time=int(slurm_time(start)),
                end_time=int(slurm_time(end)),
                time_limit_min=_num(limit, 0),
                restarts=0,
                exit_code=128 + _num(sig, 0) if _num(sig, 0) else _num(code, 0),
                work_dir=work_dir,
                reservation="" if resv in ("(null)",) else resv,
                held=False,
                account=account,
                qos=qos,
            )
        )
    return jobs
