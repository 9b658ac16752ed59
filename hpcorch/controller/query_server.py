"""The controller's query socket: how users who may not read its state database read the
pool (``hpcorch status``, ``describe``, ``report``, ``metrics``).

A Unix stream socket, ``<state dir>/query.sock`` (mode 0666 in the 0711 state directory),
served by one daemon thread of the controller's process with its own read-only
connection to the database. The asker is who the kernel says connected (SO_PEERCRED),
never what the request claims. A request is one JSON line of at most 4 KiB
(:func:`hpcorch.controller.query.parse_request`), the reply one JSON line. Every client is
bounded: its request must arrive within ``read_s``, its reply be taken within
``write_s``; at most ``max_clients`` at once, ``max_per_uid`` of one user, and each user
``rate_per_s`` requests a second (a burst of ``burst``). The thread does non-blocking I/O
only, so a client that connects and never writes holds nothing but its slot until its
deadline; the reconcile loop shares nothing with it but the database (read-only here).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.controller.query import (
    MAX_REQUEST,
    SOCKET_NAME,
    QueryError,
    Reader,
    Viewer,
    answer,
    parse_request,
)
from hpcorch.controller.store import Store
from hpcorch.paths import STATE_DB

log = logging.getLogger("hpcorch.controller.query")

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Limits:
    read_s: float = 3.0
    """Seconds a client has to send its whole request."""
    write_s: float = 10.0
    """Seconds a client has to take its whole reply."""
    max_clients: int = 64
    max_per_uid: int = 8
    rate_per_s: float = 10.0
    burst: float = 20.0
    max_reply: int = 16 << 20
    """Bytes of one reply, at most."""
    ttl_s: float = 2.0
    """Seconds a whole-pool read is shared between answers."""


def unix_address(directory: Path, name: str, dir_fd: int) -> str:
    """An address for ``directory/name`` that fits sun_path (108 bytes): the path itself,
    or the same through ``dir_fd``'s /proc entry when the path is too long."""
    path = str(directory / name)
    if len(os.fsencode(path)) < 100:
        return path
    return f"/proc/self/fd/{dir_fd}/{name}"


@dataclass
class _Client:
    sock: socket.socket
    fd: int
    uid: int
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    reply: bytes = b""
    sent: int = 0


class QueryServer:
    """The socket and its thread: ``start()`` once the state exists, ``close()`` at exit."""

    def __init__(self, directory: Path, limits: Limits | None = None) -> None:
        self.directory = directory
        self.path = directory / SOCKET_NAME
        self.limits = limits or Limits()
        self.own_uid = os.geteuid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._clients: dict[int, _Client] = {}
        self._tokens: dict[int, tuple[float, float]] = {}
        self._said: set[str] = set()
        self._reader: Reader | None = None
        self.served = 0
        """Replies sent (errors included): for tests and figures."""

    # --- life -----------------------------------------------------------------------------
    def start(self) -> bool:
        """Bind the socket and serve it; False (and a log line) when it cannot be bound:
        the controller runs on, and users then need read access to the state."""
        try:
            self._listener = self._bind()
        except OSError as exc:
            log.warning(
                "users cannot ask the controller: cannot serve %s: %s", self.path, exc.strerror
            )
            return False
        if not self.directory.stat().st_mode & 0o001:
            log.warning(
                "users cannot reach %s: %s is not searchable by others (chmod o+x %s)",
                self.path,
                self.directory,
                self.directory,
            )
        self._thread = threading.Thread(target=self._run, name="hpcorch-query", daemon=True)
        self._thread.start()
        return True

    def _bind(self) -> socket.socket:
        fd = os.open(self.directory, os.O_PATH | os.O_DIRECTORY)
        try:
            try:
                st = os.lstat(SOCKET_NAME, dir_fd=fd)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(st.st_mode):
                    raise OSError(0, "something that is not a socket is there (left as it is)")
                os.unlink(SOCKET_NAME, dir_fd=fd)  # a controller before this one left it
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(unix_address(self.directory, SOCKET_NAME, fd))
                os.chmod(SOCKET_NAME, 0o666, dir_fd=fd, follow_symlinks=False)
                listener.listen(128)
                listener.setblocking(False)
            except OSError:
                listener.close()
                raise
            return listener
        finally:
            os.close(fd)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._listener is not None:
            self._listener.close()
            try:
                if self.path.is_socket():
                    self.path.unlink()
            except OSError:
                pass

    # --- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        assert self._listener is not None
        sel.register(self._listener, selectors.EVENT_READ, None)
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                wait = min([c.deadline for c in self._clients.values()], default=now + 0.5)
                for key, _ in sel.select(max(0.0, min(wait - now, 0.5))):
                    if key.data is None:
                        self._accept(sel)
                        continue
                    client: _Client = key.data
                    if self._clients.get(client.fd) is not client:
                        continue  # dropped earlier in this round
                    if client.reply:
                        self._write(sel, client)
                    else:
                        self._read(sel, client)
                self._expire(sel)
            except Exception as exc:  # the service never dies of one client
                self._say_once(f"query service error: {type(exc).__name__}: {exc}")
                self._close_reader()
                time.sleep(0.1)
        for client in list(self._clients.values()):
            self._drop(sel, client)
        sel.close()
        self._close_reader()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of file descriptors: the clients wait in the backlog
            self._say_once(f"query socket cannot accept: {exc.strerror}")
            time.sleep(0.1)
            return
        sock.setblocking(False)
        _, uid, _ = _CREDS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        lim = self.limits
        mine = sum(1 for c in self._clients.values() if c.uid == uid)
        if len(self._clients) >= lim.max_clients or mine >= lim.max_per_uid:
            self._refuse(sock, "busy: too many clients at once; try again in a moment")
            return
        client = _Client(sock, sock.fileno(), uid, time.monotonic() + lim.read_s)
        self._clients[client.fd] = client
        sel.register(sock, selectors.EVENT_READ, client)

    def _read(self, sel: selectors.BaseSelector, client: _Client) -> None:
        try:
            chunk = client.sock.recv(MAX_REQUEST + 1 - len(client.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sel, client)
            return
        client.data += chunk
        end = client.data.find(b"\n")
        if len(client.data) > MAX_REQUEST and end < 0:
            self._respond(sel, client, _error(f"request over {MAX_REQUEST} bytes"))
            return
        if end < 0 and chunk:
            return  # more to come
        if end < 0 and not client.data:
            self._drop(sel, client)  # connected and left
            return
        request = bytes(client.data if end < 0 else client.data[:end])
        if not self._allowed(client.uid):
            rate = self.limits.rate_per_s
            self._respond(sel, client, _error(f"too many requests: at most {rate:g} a second"))
            return
        self._respond(sel, client, self._answer(request, client.uid))

    def _answer(self, request: bytes, uid: int) -> dict[str, Any]:
        try:
            req = parse_request(request)
            if self._reader is None:
                store = Store(self.directory / STATE_DB, readonly=True)
                self._reader = Reader(store, self.limits.ttl_s)
            return answer(req, Viewer.of(uid, self.own_uid), self._reader)
        except QueryError as exc:
            return _error(str(exc))
        except Exception as exc:
            self._say_once(f"query failed: {type(exc).__name__}: {exc}")
            self._close_reader()  # opened afresh for the next request
            return _error(f"the controller could not answer ({type(exc).__name__})")

    def _close_reader(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.store.close()
            self._reader = None

    def _respond(self, sel: selectors.BaseSelector, client: _Client, reply: dict[str, Any]) -> None:
        data = json.dumps(reply, separators=(",", ":")).encode() + b"\n"
        if len(data) > self.limits.max_reply:
            data = json.dumps(_error(f"reply over {self.limits.max_reply} bytes")).encode() + b"\n"
        client.reply, client.sent = data, 0
        client.deadline = time.monotonic() + self.limits.write_s
        sel.modify(client.sock, selectors.EVENT_WRITE, client)
        self._write(sel, client)

    def _write(self, sel: selectors.BaseSelector, client: _Client) -> None:
        try:
            client.sent += client.sock.send(client.reply[client.sent :])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sel, client)
            return
        if client.sent >= len(client.reply):
            self.served += 1
            self._drop(sel, client)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for client in [c for c in self._clients.values() if c.deadline <= now]:
            if client.reply:
                self._drop(sel, client)
                continue
            self._forget(sel, client)  # a request that never came: say so, if it listens
            self._refuse(client.sock, f"no request within {self.limits.read_s:g} s")

    def _drop(self, sel: selectors.BaseSelector, client: _Client) -> None:
        self._forget(sel, client)
        client.sock.close()

    def _forget(self, sel: selectors.BaseSelector, client: _Client) -> None:
        if self._clients.get(client.fd) is client:
            del self._clients[client.fd]
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(client.sock)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """One error line, if the client's buffer takes it at once; then nothing more."""
        with contextlib.suppress(OSError):
            sock.send(json.dumps(_error(why)).encode() + b"\n")
        self.served += 1
        sock.close()

    def _allowed(self, uid: int) -> bool:
        """Each user's requests: a token bucket of ``burst``, ``rate_per_s`` a second."""
        now = time.monotonic()
        tokens, last = self._tokens.get(uid, (self.limits.burst, now))
        tokens = min(self.limits.burst, tokens + (now - last) * self.limits.rate_per_s)
        if len(self._tokens) > 4096:  # forget idle users (a bucket full again is no loss)
            self._tokens = {u: v for u, v in self._tokens.items() if now - v[1] < 10}
        if tokens < 1:
            self._tokens[uid] = (tokens, now)
            return False
        self._tokens[uid] = (tokens - 1, now)
        return True

    def _say_once(self, line: str) -> None:
        if line not in self._said and len(self._said) < 100:
            self._said.add(line)
            log.warning("%s", line)


def _error(why: str) -> dict[str, Any]:
    return {"ok": False, "error": why}
