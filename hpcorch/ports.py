"""A free TCP port for a rendezvous, chosen evenly over the kernel's ephemeral range.

``bind(addr, 0)`` is what most code uses, but Linux does not choose evenly when an admin has
reserved ports inside the range (``net.ipv4.ip_local_reserved_ports``, common for MPI or
daemon ports): a choice that falls in a reserved block moves on to the first free port after
it, so about one bind in five on such a host gets the same port, and two jobs starting
together then race for it (``EADDRINUSE`` in the second one's rendezvous). Here a port is
drawn at random from the range less the reserved ports, and taken only if it binds.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PROC = Path("/proc/sys/net/ipv4")
DEFAULT_RANGE = (32768, 60999)
TRIES = 64


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """``"32000-38999,40000"`` -> ``[(32000, 38999), (40000, 40000)]``; bad parts are skipped."""
    out: list[tuple[int, int]] = []
    for part in text.replace("\t", " ").replace(",", " ").split():
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            continue
        if 0 < a <= b <= 65535:
            out.append((a, b))
    return out


def ephemeral_range(proc: Path = PROC) -> tuple[int, int]:
    """The kernel's ``ip_local_port_range`` (Linux's default where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in (proc / "ip_local_port_range").read_text().split()[:2])
    except (OSError, ValueError):
        return DEFAULT_RANGE
    return (lo, hi) if 1024 <= lo <= hi <= 65535 else DEFAULT_RANGE


def reserved_ports(proc: Path = PROC) -> list[tuple[int, int]]:
    """The ports an admin keeps out of the kernel's choice (none where unreadable)."""
    try:
        return parse_ranges((proc / "ip_local_reserved_ports").read_text())
    except OSError:
        return []


def candidates(
    rng: random.Random, span: tuple[int, int], reserved: list[tuple[int, int]], n: int
) -> list[int]:
    """Up to ``n`` ports drawn evenly from ``span``, none of them reserved."""
    lo, hi = span
    out: list[int] = []
    for _ in range(n * 4):
        if len(out) >= n:
            break
        port = rng.randint(lo, hi)
        if not any(a <= port <= b for a, b in reserved):
            out.append(port)
    return out


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port that binds on ``addr`` right now, drawn evenly from the ephemeral range."""
    host = "127.0.0.1" if addr == "localhost" else addr
    rng = random.Random()
    for port in candidates(rng, ephemeral_range(), reserved_ports(), TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
