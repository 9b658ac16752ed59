"""Checkpoint files: atomic write, torn-write discovery, validation, RNG round trip."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcorch.protocol import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
from hpcorch.runtime import checkpoint as ckpt


def payload(step: int, job: str | None = "j1", version: int = CHECKPOINT_VERSION) -> dict:
    return {
        "format": CHECKPOINT_FORMAT,
        "version": version,
        "job": job,
        "global_step": step,
        "model": {"w": torch.arange(4.0)},
    }


def test_atomic_save_and_latest(tmp_path: Path) -> None:
    for step in (5, 10, 15):
        path = ckpt.checkpoint_path(tmp_path, step)
        ckpt.save_atomic(payload(step), path)
        ckpt.prune(tmp_path, keep=2, current=path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000000010.pt", "ckpt-000000015.pt"]
    found = ckpt.find_latest(tmp_path)
    assert found.step == 15 and found.torn == ()
    assert ckpt.load(found.path, "j1")["global_step"] == 15  # type: ignore[arg-type]


def test_torn_write_is_reported_and_skipped(tmp_path: Path) -> None:
    ckpt.save_atomic(payload(10), ckpt.checkpoint_path(tmp_path, 10))
    good = ckpt.checkpoint_path(tmp_path, 10).read_bytes()
    torn = tmp_path / "ckpt-000000020.pt.tmp"
    torn.write_bytes(good[: len(good) // 2])
    found = ckpt.find_latest(tmp_path)
    assert found.step == 10 and found.torn == (torn,)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(ckpt_bytes()[:200]), "truncated or corrupt"),
        (lambda p: torch.save(payload(1, version=99), p), "version 99; this hpcorch reads"),
        (lambda p: torch.save(payload(1, job="other"), p), "belongs to job 'other'"),
        (lambda p: torch.save({"a": 1}, p), "not an hpcorch checkpoint"),
        (lambda p: p.write_text("hello"), "truncated or corrupt"),
    ],
)
def test_bad_checkpoints_name_the_problem(tmp_path: Path, make, message: str) -> None:
    path = ckpt.checkpoint_path(tmp_path, 1)
    make(path)
    before = path.read_bytes()
    with pytest.raises(ckpt.CheckpointError, match=message) as err:
        ckpt.load(path, "j1")
    assert "\n" not in str(err.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize("keep", [200, 1000, -22, -1])
def test_a_truncated_checkpoint_is_refused_before_torch_reads_it(
    tmp_path: Path, keep: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's C++ reader has aborted the process on damaged archives (SIGABRT from a
    second exception while unwinding the first); a file whose end is missing is refused
    from its zip directory alone, in Python, and the job goes on to an older one."""
    path = ckpt.checkpoint_path(tmp_path, 1)
    path.write_bytes(ckpt_bytes()[:keep])

    read: list[object] = []

    def no_torch(*a: object, **_k: object) -> None:
        read.append(a[0])
        raise RuntimeError("PytorchStreamReader failed")

    monkeypatch.setattr(torch, "load", no_torch)
    with pytest.raises(ckpt.CorruptCheckpoint, match="truncated or corrupt"):
        ckpt.load(path, "j1")
    assert read == [], "torch.load was called on a truncated checkpoint"


def ckpt_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(payload(1), buf)
    return buf.getvalue()


def test_rng_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # leaves a cached Gaussian in numpy's state
    state = ckpt.rng_state()
    expected = (random.random(), np.random.normal(), torch.rand(3))
    path = tmp_path / "x.pt"
    torch.save({"rng": state}, path)
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    ckpt.set_rng_state(torch.load(path, weights_only=True)["rng"])
    got = (random.random(), np.random.normal(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
