"""Forming the process group: from torchrun's environment, srun's, or over MPI.

``detect_launch`` is pure (environment in, ``LaunchInfo`` out); ``init_process_group`` then
does the rendezvous. With MPI (mpi4py under ``srun --mpi=pmix`` or ``mpirun``) rank 0 picks
its address and a free port and broadcasts them over MPI; with srun alone the address comes
from MASTER_ADDR (the job wrapper exports it) or the first node of the step.
"""

from __future__ import annotations

import atexit
import datetime
import os
import re
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from hpcorch import hostlist
from hpcorch.ports import free_port
from hpcorch.protocol import ENV_LAUNCHER

LAUNCHERS = ("auto", "env", "slurm", "mpi")


class LaunchError(RuntimeError):
    """The environment does not describe a usable launch."""


@dataclass(frozen=True)
class LaunchInfo:
    """Who this process is in the job, and where the rendezvous is."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None


@dataclass(frozen=True)
class DistInfo:
    """The formed process group."""

    launcher: str
    backend: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    device: torch.device
    init_seconds: float
    """Wall time of the rendezvous and process-group construction."""


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except KeyError:
        raise LaunchError(f"environment variable {name} is not set") from None
    except ValueError:
        raise LaunchError(f"environment variable {name}={env[name]!r} is not an integer") from None


def _tasks_on_node(spec: str, node_id: int) -> int:
    """Tasks on node ``node_id`` from Slurm's compressed list, e.g. ``2(x3),1``."""
    try:
        counts = hostlist.tasks_per_node(spec)
    except hostlist.HostlistError as e:
        raise LaunchError(str(e)) from None
    if not 0 <= node_id < len(counts):
        raise LaunchError(f"node index {node_id} outside tasks-per-node list {spec!r}")
    return counts[node_id]


def detect_launch(env: Mapping[str, str], launcher: str | None = None) -> LaunchInfo:
    """Read rank and world size from torchrun's, srun's or MPI's environment."""
    kind = launcher or env.get(ENV_LAUNCHER, "auto") or "auto"
    if kind not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {kind!r}; valid: {', '.join(LAUNCHERS)}")
    if kind == "auto":
        if "RANK" in env and "WORLD_SIZE" in env:
            kind = "env"
        elif "PMIX_RANK" in env or "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
            kind = "mpi"
        elif "SLURM_PROCID" in env:
            kind = "slurm"
        else:
            kind = "env"  # a single process started by hand
    addr = env.get("MASTER_ADDR") or None
    port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None
    if kind == "env":
        world = _int(env, "WORLD_SIZE") if "WORLD_SIZE" in env else 1
        rank = _int(env, "RANK") if "RANK" in env else 0
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        if world == 1:
            addr, port = addr or "127.0.0.1", port or 0
        elif addr is None or port is None:
            raise LaunchError("MASTER_ADDR and MASTER_PORT must be set when WORLD_SIZE > 1")
    elif kind == "slurm":
        world = _int(
            env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        )
        rank = _int(env, "SLURM_PROCID")
        local = _int(env, "SLURM_LOCALID")
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        local_world = _tasks_on_node(spec, _int(env, "SLURM_NODEID")) if spec else 1
        if port is None:
            job = _int(env, "SLURM_JOB_ID")
            port = 20000 + (job * 7 + int(env.get("SLURM_STEP_ID", "0") or 0)) % 20000
        if addr is None:
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if not nodes:
                raise LaunchError("neither MASTER_ADDR nor SLURM_STEP_NODELIST is set")
            addr = _first_node_addr(nodes)
    else:  # mpi: ranks come from MPI itself in init_process_group
        rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("PMIX_RANK", env.get("PMI_RANK", "0"))))
        world = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("SLURM_STEP_NUM_TASKS", "0")) or 0)
        local = int(env.get("SLURM_LOCALID", env.get("OMPI_COMM_WORLD_LOCAL_RANK", "-1")))
        local_world = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "0") or 0)
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if "SLURM_LOCALID" in env and spec and "SLURM_NODEID" in env:
            # srun knows the (virtual) node better than MPI's shared-memory view does
            local_world = _tasks_on_node(spec, _int(env, "SLURM_NODEID"))
    if kind != "mpi" and not 0 <= rank < world:
        raise LaunchError(f"rank {rank} outside world size {world}")
    return LaunchInfo(kind, rank, world, local, local_world, addr, port)


def _first_node_addr(nodelist: str) -> str:
    """Address of the first node of a Slurm node list (NodeAddr, else resolved name)."""
    try:
        first = hostlist.first(nodelist)
        out = subprocess.run(
            ["scontrol", "show", "node", first], capture_output=True, text=True, check=True
        ).stdout
        m = re.search(r"\bNodeAddr=(\S+)", out)
        if m:
            return m.group(1)
        return socket.gethostbyname(first)
    except (OSError, subprocess.CalledProcessError, hostlist.HostlistError) as e:
        raise LaunchError(f"cannot find the address of the first node of {nodelist!r}: {e}") from e


def _own_addr() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _mpi_rendezvous(info: LaunchInfo) -> LaunchInfo:
    """Ranks from MPI; rank 0's address and a free port broadcast to all."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise LaunchError("launcher 'mpi' needs mpi4py (pip install 'hpcorch[mpi]')") from e
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    local_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local, local_world = local_comm.Get_rank(), local_comm.Get_size()
    local_comm.Free()
    if info.local_rank >= 0:  # srun knows the (virtual) node better than shared memory does
        local = info.local_rank
        local_world = info.local_world_size or local + 1
    addr_port = None
    if rank == 0:
        addr = info.master_addr or _own_addr()
        addr_port = (addr, info.master_port or free_port(addr))
    addr, port = comm.bcast(addr_port, root=0)
    return replace(
        info,
        rank=rank,
        world_size=world,
        local_rank=local,
        local_world_size=local_world,
        master_addr=addr,
        master_port=port,
    )


def destroy_process_group() -> None:
    """Leave the process group if this process is in one (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def init_process_group(
    backend: str | None = None,
    launcher: str | None = None,
    timeout: datetime.timedelta = datetime.timedelta(minutes=10),
    env: Mapping[str, str] | None = None,
) -> DistInfo:
    """Join the job's process group; NCCL when CUDA is present, gloo otherwise."""
    t0 = time.perf_counter()
    info = detect_launch(os.environ if env is None else env, launcher)
    if info.launcher == "mpi":
        info = _mpi_rendezvous(info)
    assert info.master_addr is not None and info.master_port is not None
    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    if cuda:
        device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    port = info.master_port
    if port == 0:
        port = free_port(info.master_addr)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{info.master_addr}:{port}",
            rank=info.rank,
            world_size=info.world_size,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
        # A group left for the interpreter's finalization can abort the process (gloo's
        # worker threads outlive Python: "terminate called without an active exception"
        # after training finished): tear it down while Python is still alive.
        atexit.register(destroy_process_group)
    return DistInfo(
        launcher=info.launcher,
        backend=backend,
        rank=info.rank,
        world_size=info.world_size,
        local_rank=info.local_rank,
        local_world_size=info.local_world_size,
        master_addr=info.master_addr,
        master_port=port,
        device=device,
        init_seconds=time.perf_counter() - t0,
    )
