"""The rendezvous port helper: even over the ephemeral range, never a reserved port."""

from __future__ import annotations

import random
import socket
from collections import Counter
from pathlib import Path

import pytest

from hpcorch import ports


def proc_dir(tmp_path: Path, span: str, reserved: str) -> Path:
    (tmp_path / "ip_local_port_range").write_text(span + "\n")
    (tmp_path / "ip_local_reserved_ports").write_text(reserved + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", []),
        ("32000-38999", [(32000, 38999)]),
        ("32000-38999,40000\n", [(32000, 38999), (40000, 40000)]),
        ("x,5-3,70000,7-9", [(7, 9)]),
    ],
)
def test_reserved_lists_parse_as_the_kernel_writes_them(text: str, want: list) -> None:
    assert ports.parse_ranges(text) == want


def test_the_kernels_range_is_read_and_a_bad_one_falls_back(tmp_path: Path) -> None:
    assert ports.ephemeral_range(proc_dir(tmp_path, "39000\t60999", "")) == (39000, 60999)
    assert ports.ephemeral_range(proc_dir(tmp_path, "9 8", "")) == ports.DEFAULT_RANGE
    assert ports.ephemeral_range(tmp_path / "absent") == ports.DEFAULT_RANGE
    assert ports.reserved_ports(tmp_path / "absent") == []


def test_draws_are_even_and_skip_a_reserved_block() -> None:
    # the CI host's shape: 32768-60999 with 32000-38999 reserved. The kernel's own bind(0)
    # then gave port 39001 to 429 of 2,000 binds; here no port may repeat that often.
    reserved = ports.parse_ranges("32000-38999")
    got = ports.candidates(random.Random(7), (32768, 60999), reserved, 20000)
    assert len(got) == 20000
    assert all(39000 <= p <= 60999 for p in got)
    assert Counter(got).most_common(1)[0][1] < 10
    assert sum(p < 40000 for p in got) / len(got) == pytest.approx(1000 / 22000, abs=0.01)


def test_a_wholly_reserved_range_yields_no_candidate() -> None:
    assert ports.candidates(random.Random(1), (40000, 40009), [(40000, 40009)], 8) == []


def test_the_port_given_binds_and_a_taken_one_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        # every draw is the taken port: the helper must fall back to one that binds
        monkeypatch.setattr(ports, "candidates", lambda *a: [taken] * 3)
        port = ports.free_port("localhost")
        assert port != taken
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
