"""The demo's sequence on the real local pool, with the demo's policy (share-batch): an
elastic job alone on the pool, a second job arriving makes it shrink, it grows back when
that one ends, and its global batch follows its GPUs; `hpcorch report` on the live pool."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Pool
from tests.integration.controller_util import (
    ELASTIC,
    FAST,
    ControllerProc,
    submit,
    wait_for,
    wait_for_phase,
)

pytestmark = pytest.mark.slurm


def test_demo_sequence_grow_shrink_batch(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-demo-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n1", "--policy", "share-batch", *FAST
    )
    ctl.start()
    try:
        out = env_pool.hpcorch(
            "submit", "--pool", res, "--name", "A", "--min-gpus", "1", "--max-gpus", "8",
            "--batch-size", "64", "--max-batch-size", "256", "--max-per-gpu-batch", "32",
            "--parsable", str(ELASTIC), "--global-batch", "64", "--samples", "2048",
            "--epochs", "40", "--sample-delay", "0.002",
        )  # fmt: skip
        a = int(out.stdout.strip())
        wait_for("A running", lambda: ctl.phase(a) == "running", 90, ctl.log)
        time.sleep(6)  # A trains alone: samples for the models
        b = submit(env_pool, res, "B", 2, 2, "--epochs", "2", "--sample-delay", "0.002")

        def moves() -> list[tuple[str, int, int]]:
            return [
                (d.action, d.from_gpus, d.to_gpus)
                for d in ctl.decisions()
                if d.slurm_id == a and d.action == "signal" and d.detail.startswith("resize")
            ]

        wait_for("A shrunk for B", lambda: any(t < f for _, f, t in moves()), 90, ctl.log)
        wait_for_phase(ctl, b, "done", 240)
        wait_for("A grown back", lambda: any(t > f for _, f, t in moves()[1:]), 120, ctl.log)

        def batches_trained() -> set[int]:
            store = ctl.store()
            try:
                return {s.global_batch for s in store.samples(a)}
            finally:
                store.close()

        wait_for("A training at a second batch", lambda: len(batches_trained()) >= 2, 120, ctl.log)

        out = env_pool.hpcorch("report", "--state-dir", str(ctl.state), "--json").stdout
        doc = json.loads(out)
        ra = next(j for j in doc["jobs"] if j["job_id"] == a)
        kinds = [m["kind"] for m in ra["marks"]]
        assert "shrink" in kinds and "grow" in kinds
        # the policy's batch follows A's GPUs: more than one global batch in its plans
        batches = {d.global_batch for d in ctl.decisions() if d.slurm_id == a}
        assert len(batches | set(ra["batches"])) >= 2, (batches, ra["batches"])
        assert len(set(ra["batches"])) >= 2, ra["batches"]
        assert len({s["gpus"] for s in ra["segments"]}) >= 2
        rb = next(j for j in doc["jobs"] if j["job_id"] == b)
        assert rb["phase"] == "done" and rb["jct_s"] > 0 and rb["final_loss"] is not None
        png = tmp_path / "live.png"
        env_pool.hpcorch("report", "--state-dir", str(ctl.state), "--out", str(png))
        assert png.stat().st_size > 20_000
    finally:
        ctl.stop()
        subprocess.run(["scancel", f"--reservation={res}"], env=env_pool.env, check=False)
        time.sleep(1)
        subprocess.run(["scontrol", "delete", "reservation", res], env=env_pool.env, check=False)
