"""The controller's state stays small on disk: its write-ahead log is folded into the
database and cut back, not left to grow to SQLite's 4 MB default (a state directory of a
few MB, as the full-disk test mounts, filled within minutes of one-second cycles)."""

from __future__ import annotations

from pathlib import Path

from hpcorch.controller.store import WAL_BYTES
from tests.test_controller_logic import FakeCluster, controller


def test_the_write_ahead_log_stays_within_its_bound(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 2)
    ctl = controller(tmp_path, c)
    for _ in range(300):
        ctl.cycle()
        c.t += 1
    wal = next(tmp_path.rglob("state.db-wal"))
    assert wal.stat().st_size <= WAL_BYTES, wal.stat().st_size
