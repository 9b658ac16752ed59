"""The controller's query socket (hpcorch.controller.query_server) on a real Unix socket
and a real store: who asks is what the kernel says, and no client, however bad, holds
the service: garbage, a huge request, clients that never write, too many clients, a flood."""

from __future__ import annotations

import json
import os
import pwd
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcorch.cli.poolview import PoolViewError, ask, load_view
from hpcorch.controller.query import SOCKET_NAME
from hpcorch.controller.query_server import Limits, QueryServer
from hpcorch.controller.store import JobRecord, Store

LIMITS = Limits(read_s=0.5, write_s=2.0, max_clients=12, max_per_uid=4, burst=50)


def record(slurm_id: int, user: str, uid: int) -> JobRecord:
    return JobRecord(
        slurm_id=slurm_id, job_key="k", name=f"{user}-job", user=user,
        job_dir=f"/home/{user}/jobs/k", app="", min_gpus=1, max_gpus=2, batch=8, max_batch=8,
        max_micro=8, submit_time=1.0, phase="running", phase_since=1.0, gpus=1, uid=uid,
    )  # fmt: skip


def state_dir(root: Path) -> Path:
    """A state directory as the controller keeps it (0711), with two users' jobs."""
    d = root / "state"
    d.mkdir(mode=0o711)
    d.chmod(0o711)
    store = Store(d / "state.db")
    store.put_jobs([record(11, "root", 0), record(12, "nobody", 65534)])
    store.close()
    return d


@pytest.fixture
def server(tmp_path: Path) -> Iterator[QueryServer]:
    srv = QueryServer(state_dir(tmp_path), LIMITS)
    assert srv.start()
    try:
        yield srv
    finally:
        srv.close()


def raw(path: Path, data: bytes, shut: bool = True) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return json.loads(out)  # type: ignore[no-any-return]


def test_the_socket_is_open_to_all_in_a_private_directory(server: QueryServer) -> None:
    st = server.path.stat()
    assert oct(st.st_mode & 0o777) == "0o666" and st.st_uid == os.geteuid()
    assert (server.directory / "state.db").stat().st_mode & 0o777 == 0o640
    reply = ask(server.directory, {"q": "status"})
    assert reply["everything"] == (os.geteuid() == 0) and len(reply["jobs"]) == 2  # type: ignore[arg-type]


def test_who_asks_is_the_kernels_word(tmp_path: Path) -> None:
    """A child that became 'nobody' asks: it sees its own job in full, root's reduced,
    whatever it claims to be."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    root = Path(tempfile.mkdtemp(dir="/tmp"))
    root.chmod(0o711)
    srv = QueryServer(state_dir(root), LIMITS)
    assert srv.start()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as nobody
        try:
            os.setgid(65534)
            os.setuid(65534)
            out = [ask(srv.directory, {"q": "status"})]
            try:
                ask(srv.directory, {"q": "status", "user": "root"})
            except PoolViewError as exc:
                out.append({"error": str(exc)})
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    srv.close()
    reply, refused = json.loads(data)
    assert reply["user"] == pwd.getpwuid(65534).pw_name and not reply["everything"]
    jobs = {j["slurm_id"]: j for j in reply["jobs"]}
    assert jobs[12]["full"] and jobs[12]["job_dir"] == "/home/nobody/jobs/k"
    assert not jobs[11]["full"] and "job_dir" not in jobs[11]
    assert refused["error"] == "unknown request key 'user' (valid: v, q, job)"


def test_garbage_and_a_huge_request_get_one_line(server: QueryServer) -> None:
    assert raw(server.path, b"\x00\xffgarbage\n") == {
        "ok": False, "error": "the request is not one JSON object (UTF-8, one line)",
    }  # fmt: skip
    huge = raw(server.path, b'{"q": "status", "x": "' + b"x" * (1 << 20))
    assert huge == {"ok": False, "error": "request over 4096 bytes"}
    assert raw(server.path, b'{"q": "status"}')["ok"] is True  # no newline: the end is EOF


def test_clients_that_never_write_hold_no_one_up(server: QueryServer) -> None:
    silent = []
    for _ in range(LIMITS.max_per_uid):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(server.path))
        silent.append(s)
    t0 = time.monotonic()
    # one more of the same user: refused at once, not queued behind them
    assert raw(server.path, b'{"q": "status"}\n')["error"].startswith("busy")  # type: ignore[union-attr]
    assert time.monotonic() - t0 < 0.3
    time.sleep(LIMITS.read_s + 0.3)
    for s in silent:  # each dropped at its deadline, told why
        s.settimeout(2)
        assert json.loads(s.recv(4096)) == {"ok": False, "error": "no request within 0.5 s"}
        assert s.recv(4096) == b""
        s.close()
    assert raw(server.path, b'{"q": "status"}\n')["ok"] is True


def test_a_flood_is_answered_at_the_rate_and_no_more(tmp_path: Path) -> None:
    srv = QueryServer(state_dir(tmp_path), Limits(rate_per_s=5, burst=10))
    assert srv.start()
    try:
        replies = [raw(srv.path, b'{"q": "status"}\n') for _ in range(40)]
    finally:
        srv.close()
    ok = sum(1 for r in replies if r["ok"])
    assert 10 <= ok <= 14, ok  # the burst, and what refilled meanwhile
    assert {r.get("error") for r in replies if not r["ok"]} == {
        "too many requests: at most 5 a second"
    }


def test_a_long_state_path_and_a_socket_left_behind(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    d = state_dir(deep)
    assert len(str(d / SOCKET_NAME)) > 108
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(d, os.O_PATH | os.O_DIRECTORY)
    stale.bind(f"/proc/self/fd/{fd}/{SOCKET_NAME}")  # a killed controller's socket
    stale.close()
    os.close(fd)
    srv = QueryServer(d, LIMITS)
    assert srv.start()
    try:
        view = load_view(d) if os.geteuid() else None
        reply = ask(d, {"q": "describe", "job": 11})
        assert reply["job"]["slurm_id"] == 11  # type: ignore[index]
        assert view is None or len(view.records) == 2
    finally:
        srv.close()
    assert not (d / SOCKET_NAME).exists()


def test_something_else_in_the_sockets_place_is_left_alone(tmp_path: Path) -> None:
    d = state_dir(tmp_path)
    (d / SOCKET_NAME).write_text("not a socket")
    srv = QueryServer(d, LIMITS)
    assert not srv.start()
    assert (d / SOCKET_NAME).read_text() == "not a socket"


def test_no_controller_is_one_line(tmp_path: Path) -> None:
    d = state_dir(tmp_path)
    with pytest.raises(PoolViewError) as exc:
        ask(d, {"q": "status"})
    assert str(exc.value) == (
        f"cannot read the controller's state {d}/state.db (permission denied) and the "
        f"controller does not answer on {d}/{SOCKET_NAME} (No such file or directory): is "
        "the controller running? (an admin: systemctl status hpcorch-controller; or let you "
        "read the state)"
    )
