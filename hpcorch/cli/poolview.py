"""The controller's view of the pool, for ``status``, ``describe``, ``report`` and
``metrics``: read from its state database by whoever may read it (the admins, the
controller's user), else asked of the controller's query socket, which answers each user
what they may see (their own jobs in full, others' as squeue shows them). Either way the
commands get the same records and render them with the same code.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hpcorch.controller.query import MAX_JOB_ID, QUERY_VERSION, SOCKET_NAME, record_from
from hpcorch.controller.store import JobRecord, Store
from hpcorch.errors import HpcorchError
from hpcorch.paths import STATE_DB

MAX_REPLY = 16 << 20
TIMEOUT_S = 30.0
Access = Literal["db", "socket", "none"]


class PoolViewError(HpcorchError):
    """Neither the state database nor the controller can be read: one line, what to do."""


@dataclass
class View:
    """The controller's jobs and pool as this user may see them."""

    records: list[JobRecord]
    pool: list[dict[str, Any]]
    full: set[int]
    """Jobs seen in full (all of them when read from the database)."""
    foreign: list[dict[str, Any]] = field(default_factory=list)
    """Jobs on the pool's nodes the controller did not place (squeue's view of them)."""


def access(directory: Path) -> Access:
    """How this user reads the controller's state in ``directory``: its database when
    readable, else its socket; "none" when there is no controller state there."""
    db = directory / STATE_DB
    try:
        if db.exists():
            return "db" if os.access(db, os.R_OK) else "socket"
        return "socket" if (directory / SOCKET_NAME).exists() else "none"
    except PermissionError:
        return "socket"  # the directory is closed to us: asking says so, in one line


def ask(directory: Path, request: dict[str, Any], timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The controller's reply to ``request`` through its socket (a PoolViewError with one
    line when it cannot be asked, or refuses)."""
    body = json.dumps({"v": QUERY_VERSION, **request}).encode() + b"\n"
    path = directory / SOCKET_NAME
    try:
        fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        raise _unreachable(directory, exc.strerror or str(exc)) from None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(_address(directory, fd))
            s.sendall(body)
            data = bytearray()
            while len(data) <= MAX_REPLY and not data.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        raise _unreachable(directory, f"no reply within {timeout:g} s") from None
    except OSError as exc:
        raise _unreachable(directory, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    try:
        reply = json.loads(bytes(data))
        if not isinstance(reply, dict):
            raise ValueError
    except ValueError:
        raise PoolViewError(f"the controller's reply on {path} is not one JSON object") from None
    if not reply.get("ok"):
        raise PoolViewError(str(reply.get("error", "the controller refused"))[:500])
    return reply


def _address(directory: Path, fd: int) -> str:
    path = str(directory / SOCKET_NAME)
    return path if len(os.fsencode(path)) < 100 else f"/proc/self/fd/{fd}/{SOCKET_NAME}"


def _unreachable(directory: Path, why: str) -> PoolViewError:
    db, sock = directory / STATE_DB, directory / SOCKET_NAME
    return PoolViewError(
        f"cannot read the controller's state {db} (permission denied) and the controller "
        f"does not answer on {sock} ({why}): is the controller running? (an admin: "
        "systemctl status hpcorch-controller; or let you read the state)"
    )


def load_view(directory: Path) -> View | None:
    """The controller's jobs and pool; None when there is no controller state here."""
    how = access(directory)
    if how == "none":
        return None
    if how == "db":
        store = Store(directory / STATE_DB, readonly=True)
        try:
            records = store.jobs()
            pool = json.loads(store.get_meta("pool") or "[]")
            foreign = json.loads(store.get_meta("foreign") or "[]")
        finally:
            store.close()
        return View(records, pool, {r.slurm_id for r in records}, foreign)
    reply = ask(directory, {"q": "status"})
    docs = reply.get("jobs", [])
    records = [record_from(d) for d in docs]
    full = {int(d["slurm_id"]) for d in docs if d.get("full")}
    return View(records, list(reply.get("pool", [])), full, list(reply.get("foreign", [])))


def ask_job(directory: Path, kind: str, job_id: int) -> dict[str, Any]:
    if not 1 <= job_id <= MAX_JOB_ID:
        raise PoolViewError(f"job must be a Slurm job id (1..{MAX_JOB_ID})")
    return ask(directory, {"q": kind, "job": job_id})


def metrics_text(directory: Path, job_id: int | None = None) -> str:
    """``hpcorch metrics``: the exposition text of the pool, every job's series (a user
    asking the socket: their own jobs'), or with ``job_id`` that job's only."""
    from hpcorch.controller import prom
    from hpcorch.controller.query import render_families

    how = access(directory)
    if how == "socket":
        return str(
            ask(directory, {"q": "metrics", **({"job": job_id} if job_id else {})})["metrics"]
        )
    store = Store(directory / STATE_DB, readonly=True)  # "no controller state at ..." if none
    try:
        if job_id is None:
            return prom.render_metrics(store)
        if store.job(job_id) is None:
            raise PoolViewError(f"no job {job_id} in the controller's state")
        return render_families(list(prom.collect(store)), {job_id}.__contains__)
    finally:
        store.close()
