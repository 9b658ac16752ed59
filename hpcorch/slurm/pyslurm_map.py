"""Pure mappings between pyslurm 25.11's objects (read through their documented
attributes, as a real slurmctld fills them) and hpcorch's jobs, nodes and submit options.
No IO: ``hpcorch.slurm.pyslurm_backend`` makes the calls."""

from __future__ import annotations

import enum
import signal as signals
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hpcorch.cluster import ENDED_STATES
from hpcorch.errors import SlurmCommandError
from hpcorch.slurm.backend import expand_nodelist
from hpcorch.slurm.parse import SlurmJob, SlurmNode, gpu_type_in, gpus_in

_PENDING_FLAGS = {"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"}
"""pyslurm reports a job's state flag in place of its base state; these flags only occur
on pending jobs (Slurm 23.11+'s JSON lists them after PENDING)."""
_RUNNING_FLAGS = {"CONFIGURING", "RESIZING", "SIGNALING", "POWER_UP_NODE"}
_NOT_HOLDING = ENDED_STATES | {"PENDING"}

# sbatch option -> JobSubmitDescription attribute, for the options hpcorch's batch script
# renderer writes (hpcorch/slurm/script.py) and the usual extras an admin may add.
_SUBMIT_OPTIONS: dict[str, str] = {
    "job-name": "name",
    "nodes": "nodes",
    "gres": "gres_per_node",
    "cpus-per-gpu": "cpus_per_gpu",
    "cpus-per-task": "cpus_per_task",
    "mincpus": "min_cpus_per_node",
    "ntasks-per-node": "ntasks_per_node",
    "partition": "partitions",
    "reservation": "reservations",
    "time": "time_limit",
    "output": "standard_output",
    "error": "standard_error",
    "open-mode": "log_files_open_mode",
    "signal": "signal",
    "comment": "comment",
    "account": "account",
    "qos": "qos",
    "chdir": "working_directory",
    "nodelist": "required_nodes",
    "exclude": "excluded_nodes",
    "constraint": "constraints",
    "mem": "memory_per_node",
    "mem-per-cpu": "memory_per_cpu",
    "mem-per-gpu": "memory_per_gpu",
    "mail-type": "mail_types",
    "mail-user": "mail_user",
    "dependency": "dependencies",
    "licenses": "licenses",
    "begin": "begin_time",
    "deadline": "deadline",
    "nice": "nice",
    "wckey": "wckey",
    "exclusive": "resource_sharing",
}
_SUBMIT_FLAGS: dict[str, tuple[str, Any]] = {
    "hold": ("priority", 0),
    "requeue": ("is_requeueable", True),
    "no-requeue": ("is_requeueable", False),
    "exclusive": ("resource_sharing", "exclusive"),
}
NO_VAL = 0xFFFFFFFE
"""Slurm's "not set" for a 32-bit field."""
UNSET_NTASKS = NO_VAL
"""``JobSubmitDescription.ntasks`` for a job that names no task count, as with sbatch.
pyslurm 25.11 sends ntasks=1 when given none (any falsy value), and slurmctld then holds
the job to 1 task x 1 CPU: once the controller set MinCPUsNode=8 NumCPUs=8 for 4 GPUs it
pended for Resources ("never runnable") on an idle node. NO_VAL passes through pyslurm
as "not set"."""

_LIST_ATTRS = {
    "partitions",
    "reservations",
    "required_nodes",
    "excluded_nodes",
    "licenses",
    "mail_types",
}


_FLAG_NAMES = {"IGNORE_RUNNING_JOBS": "IGNORE_JOBS"}
"""pyslurm's names for reservation flags that scontrol spells otherwise."""


def _names(value: Any) -> list[str]:
    """A list attribute that pyslurm may give as a list, a comma-separated string or an
    ``enum.Flag`` (``Reservation.flags``: its members' names)."""
    if isinstance(value, enum.Flag):
        return [_FLAG_NAMES.get(str(m.name), str(m.name)) for m in type(value) if m in value]
    if not value:
        return []
    if isinstance(value, str):
        return [v for v in value.split(",") if v]
    return [str(v) for v in value]


def gpus_in_gres(value: Any) -> int:
    """GPUs in a pyslurm GRES value: a dict such as ``{"gpu": 4}``,
    ``{"gpu:a100": {"count": 2, "indexes": "0-1"}}``, or a Slurm GRES/TRES string."""
    if value is None:
        return 0
    if isinstance(value, str):
        return gpus_in(value)
    if not isinstance(value, Mapping):
        return 0
    total = 0
    for key, count in value.items():
        name = str(key).removeprefix("gres/").removeprefix("gres:")
        if name != "gpu" and not name.startswith("gpu:"):
            continue
        if isinstance(count, Mapping):
            count = count.get("count", 0)
        try:
            total += int(count)
        except (TypeError, ValueError):
            continue
    return total


def gpu_type_in_gres(value: Any) -> str:
    """The GPU type in a pyslurm GRES value (``{"gpu:a100": 4}`` -> ``a100``), "" when
    untyped."""
    if isinstance(value, str):
        return gpu_type_in(value)
    if not isinstance(value, Mapping):
        return ""
    for key in value:
        name = str(key).removeprefix("gres/").removeprefix("gres:")
        if name.startswith("gpu:"):
            return gpu_type_in(f"{name}:1")
    return ""


def _int(value: Any) -> int:
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def _time_limit(value: Any) -> int:
    """Minutes; 0 for UNLIMITED (pyslurm gives None or "UNLIMITED")."""
    minutes = _int(value)
    return 0 if minutes >= 0xFFFFFFFE or minutes < 0 else minutes


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def base_state(state: str) -> str:
    """The job's base state from pyslurm's state string (which names a flag when set)."""
    state = state.upper() or "UNKNOWN"
    if state in _PENDING_FLAGS:
        return "PENDING"
    if state in _RUNNING_FLAGS:
        return "RUNNING"
    return state


def _layout_gpus(job: Any) -> dict[str, int]:
    """GPUs the job holds on each node, from pyslurm's resource layout
    (``{node: {"cpu_ids": ..., "gres": {"gpu": {"count": 4, ...}}, ...}}``)."""
    layout_of = getattr(job, "get_resource_layout_per_node", None)
    if not callable(layout_of):
        return {}
    try:
        layout = layout_of()
    except (ValueError, TypeError, AttributeError):
        return {}
    if not isinstance(layout, Mapping):
        return {}
    return {
        str(name): gpus_in_gres(entry.get("gres")) if isinstance(entry, Mapping) else 0
        for name, entry in layout.items()
    }


def gpus_by_node_from_pyslurm(job: Any) -> tuple[int, ...]:
    """GPUs on each allocated node, in the job's node order."""
    layout = _layout_gpus(job)
    if not layout:
        return ()
    order = expand_nodelist(_str(job.allocated_nodes))
    names = [n for n in order if n in layout] or list(layout)
    return tuple(layout[name] for name in names)


def holds_nodes(job: Any) -> bool:
    """Whether the job holds its nodes' resources now (running, completing, suspended...:
    neither pending nor ended)."""
    return bool(job.allocated_nodes) and base_state(_str(job.state)) not in _NOT_HOLDING


def gpus_in_use(jobs: Iterable[Any]) -> dict[str, int]:
    """Node -> GPUs allocated on it, summed over the jobs that hold nodes. pyslurm 25.11's
    ``Node`` has no GRES-in-use (``allocated_gres`` reads the node's allocated TRES, which
    name GPUs only where AccountingStorageTRES tracks gres/gpu), so it is counted from the
    jobs, as Slurm itself counts it."""
    used: dict[str, int] = {}
    for job in jobs:
        if holds_nodes(job):
            for name, gpus in _layout_gpus(job).items():
                used[name] = used.get(name, 0) + gpus
    return used


def cpus_per_gpu_from_pyslurm(job: Any, gpus: int) -> int:
    """CPUs per GPU the job asked for (``--cpus-per-gpu``), 0 when not given.

    pyslurm 25.11's ``Job.cpus_per_gpu`` answers None for every job slurmctld returns (it
    also wants ``cpus_per_task`` unset, which slurmctld always sets), and no attribute
    gives Slurm's ``cpus_per_tres``; but ``Job.cpus_per_task`` is None exactly when
    ``cpus_per_tres`` is set, and the job's CPUs are then its GPUs' CPUs (NumCPUs=6 for
    ``--gres=gpu:2 --cpus-per-gpu=3``)."""
    given = getattr(job, "cpus_per_gpu", None)
    if isinstance(given, int) and given > 0:
        return given
    if getattr(job, "cpus_per_task", 1) is not None or gpus <= 0:
        return 0
    cpus = _int(getattr(job, "cpus", 0))
    return cpus // gpus if cpus >= gpus and cpus % gpus == 0 else 0


def job_from_pyslurm(job: Any) -> SlurmJob:
    """A ``pyslurm.Job`` as hpcorch's ``SlurmJob`` (same values ``squeue --json`` gives)."""
    state = base_state(_str(job.state))
    reason = _str(job.state_reason)
    signal = _int(getattr(job, "exit_code_signal", 0))
    node_count = _int(job.num_nodes)
    nodes = _str(job.allocated_nodes)
    if not node_count and nodes:
        node_count = 1
    per_node = gpus_in_gres(job.gres_per_node)
    by_node = gpus_by_node_from_pyslurm(job) if nodes else ()
    gpus = sum(by_node) if by_node else per_node * node_count
    return SlurmJob(
        job_id=_int(job.id),
        name=_str(job.name),
        user=_str(job.user_name) or _str(job.user_id),
        state=state,
        reason="None" if reason in ("", "None") else reason,
        partition=_str(job.partition),
        nodes=nodes,
        node_count=node_count,
        gpus_per_node=per_node,
        comment=_str(job.comment),
        submit_time=_int(job.submit_time),
        start_time=_int(job.start_time),
        end_time=_int(job.end_time),
        time_limit_min=_time_limit(job.time_limit),
        restarts=_int(job.requeue_count),
        exit_code=128 + signal if signal else _int(job.exit_code),
        work_dir=_str(job.working_directory),
        reservation=_str(job.reservation),
        held=job.priority is not None and _int(job.priority) == 0 and state == "PENDING",
        special_exit=_str(job.state).upper() == "SPECIAL_EXIT",
        uid=_int(job.user_id) if isinstance(job.user_id, int) else -1,
        gpus_by_node=by_node,
        cpus_per_gpu=cpus_per_gpu_from_pyslurm(job, gpus),
        account=_str(getattr(job, "account", "")),
        cpus=_int(getattr(job, "cpus", 0)),
        qos=_str(getattr(job, "qos", "")),
        batch=_batch_flag(job),
        requeue=bool(getattr(job, "is_requeueable", True)),
    )


def _batch_flag(job: Any) -> bool:
    """Whether a ``pyslurm.Job`` is a batch job (not salloc/srun): ``Job.is_batch_job``."""
    flag = getattr(job, "is_batch_job", None)
    return True if flag is None else bool(flag)


def node_from_pyslurm(node: Any, gpus_used: int = 0) -> SlurmNode:
    """A ``pyslurm.Node`` as hpcorch's ``SlurmNode``; ``gpus_used``: the GPUs jobs hold
    on it (:func:`gpus_in_use`)."""
    # state is Slurm's complete string, e.g. "IDLE+DRAIN" or "MIXED+NOT_RESPONDING"
    states = tuple(s for s in _str(node.state).upper().split("+") if s)
    return SlurmNode(
        name=_str(node.name),
        address=_str(node.address),
        states=states,
        partitions=tuple(str(p) for p in node.partitions or ()),
        cpus=_int(node.total_cpus),
        gpus=gpus_in_gres(node.configured_gres),
        gpus_used=gpus_used,
        reason=_str(node.reason),
        cpus_used=_int(node.allocated_cpus),
        gpu_type=gpu_type_in_gres(node.configured_gres),
    )


def signal_name(sig: str) -> str:
    """ "USR2" -> "SIGUSR2" (pyslurm resolves names through Python's signal module)."""
    if sig.isdigit():
        return signals.Signals(int(sig)).name
    return sig if sig.upper().startswith("SIG") else f"SIG{sig.upper()}"


def submit_options(script: str, args: Sequence[str] = ()) -> dict[str, Any]:
    """``JobSubmitDescription`` keyword arguments for a batch script given as text and
    extra sbatch options (which, as with sbatch, win over the script's ``#SBATCH`` lines).
    An option this mapping does not know is an error, never silently dropped."""
    options: list[str] = list(args)
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            option = stripped[len("#SBATCH") :].strip()
            if option:
                options.append(option)
        elif stripped and not stripped.startswith("#"):
            break  # sbatch stops reading options at the first command
    out: dict[str, Any] = {"script": script, "ntasks": UNSET_NTASKS}
    seen: set[str] = set()
    for opt in options:
        if not opt.startswith("--"):
            raise SlurmCommandError(f"pyslurm backend: use long sbatch options, not {opt!r}")
        name, has_value, value = opt[2:].partition("=")
        if name in _SUBMIT_FLAGS and not has_value:
            flag_attr, flag_value = _SUBMIT_FLAGS[name]
            if flag_attr not in seen:
                out[flag_attr] = flag_value
                seen.add(flag_attr)
            continue
        attr = _SUBMIT_OPTIONS.get(name, "")
        if not attr or not has_value:
            known = sorted({*_SUBMIT_OPTIONS, *_SUBMIT_FLAGS})
            raise SlurmCommandError(
                f"pyslurm backend cannot submit sbatch option '--{name}' "
                f"(supported: {', '.join(known)}; or set HPCORCH_SLURM_BACKEND=cli)"
            )
        if attr in seen:
            continue  # the first occurrence wins: command-line args come first
        seen.add(attr)
        if attr in _LIST_ATTRS:
            out[attr] = [v for v in value.split(",") if v]
        elif attr == "time_limit" and value.isdigit():
            # pyslurm 25.11 hands a digit string to Slurm as is ("an integer is required")
            out[attr] = int(value)
        elif attr == "signal":
            flags, _, rest = value.rpartition(":")
            sig, at, when = rest.partition("@")
            out[attr] = f"{flags + ':' if flags else ''}{signal_name(sig)}{at}{when}"
        else:
            out[attr] = value
    return out
