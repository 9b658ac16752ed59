"""A Hugging Face Trainer job and a Lightning job, each one line away from a plain script,
resized 2 -> 1 -> 4 GPUs and then rebatched by the controller on the real pool: every
launch trains at the global batch of its plan, the job ends COMPLETED, and the samples it
trained are checked against the stated resume bound (hpcorch/integrations/layout.py)."""

from __future__ import annotations

import getpass
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.reconcile import Settings
from hpcorch.controller.store import Store
from hpcorch.policy.types import JobPlan, Plan, Snapshot
from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.cluster import SlurmCluster
from tests.conftest import REPO, Pool
from tests.integration.controller_util import metrics_lines, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPTS = {
    "transformers": REPO / "examples" / "train_transformers.py",
    "lightning": REPO / "examples" / "train_lightning_elastic.py",
}
EPOCHS, SAMPLES = 2, 1024
PHASES = [(2, 32), (1, 48), (4, 64), (4, 128)]
"""(GPUs, global batch) the policy plans, one after the other: two resizes, then a new
batch at the same GPUs (a rebatch). The per-GPU batch is at most 16."""


class Scripted:
    """Every job on the first node at the phase's GPUs and global batch."""

    name = "scripted"

    def __init__(self) -> None:
        self.gpus, self.batch = PHASES[0]

    def schedule(self, snapshot: Snapshot) -> Plan:
        g, b = self.gpus, self.batch
        micro = min(16, b // g)
        accum = b // (g * micro)
        return Plan(tuple(JobPlan(j.job_id, g, {0: g}, b, micro, accum) for j in snapshot.jobs))


def steps_at(lines: list[dict[str, Any]], gpus: int, batch: int) -> int:
    return sum(
        1
        for m in lines
        if m.get("event") == "steps" and m.get("gpus") == gpus and m.get("global_batch") == batch
    )


def records(prefix: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(prefix.parent.glob(prefix.name + ".*.jsonl")):
        out += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    return out


@pytest.mark.parametrize("library", ["transformers", "lightning"])
def test_library_job_resized_2_1_4_and_rebatched(
    env_pool: Pool, tmp_path: Path, library: str
) -> None:
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # nothing is downloaded
    env_pool = Pool(env_pool.dir, {**env_pool.env, **offline}, 4, 4, env_pool.home)
    res = f"t-integ-{library[:5]}-{os.getpid()}"
    spool = Path(env_pool.env["HPCORCH_SPOOL"])
    cluster = SlurmCluster(res, SlurmCLI(env=env_pool.env), spool=spool)
    cluster.ensure_reservation("n1", getpass.getuser(), None)
    policy = Scripted()
    cfg = LoopConfig(round_s=0, restart_cost_s=0, settings=Settings(min_run_s=0))
    ctl = Controller(cluster, Store(tmp_path / "state.db"), policy, cfg, log=print)
    work = tmp_path / "work"
    work.mkdir()
    record = work / "seen"
    out_dir = "--output-dir" if library == "transformers" else "--root-dir"
    started = time.monotonic()
    try:
        submitted = env_pool.hpcorch(
            "submit", "--pool", res, "--name", library[:5], "--min-gpus", "1",
            "--max-gpus", "4", "--batch-size", "32", "--max-batch-size", "128",
            "--max-per-gpu-batch", "16", "--parsable", str(SCRIPTS[library]),
            out_dir, str(work / "out"), "--epochs", str(EPOCHS), "--samples", str(SAMPLES),
            "--batch-size", "16", "--record", str(record), "--sample-delay", "0.02",
        )  # fmt: skip
        job = int(submitted.stdout.strip())

        def cycle_until(what: str, cond: Any, timeout: float) -> None:
            def step() -> bool:
                ctl.cycle()
                return bool(cond())

            wait_for(what, step, timeout)

        for i, (gpus, batch) in enumerate(PHASES):
            policy.gpus, policy.batch = gpus, batch
            last = i == len(PHASES) - 1
            cycle_until(
                f"{library} training on {gpus} GPUs at {batch}",
                lambda g=gpus, b=batch: steps_at(metrics_lines(env_pool, job), g, b) >= 2,
                300,
            )
            if last:
                cycle_until(f"{library} done", lambda: ctl.store.job(job).phase == "done", 300)  # type: ignore[union-attr]
        assert env_pool.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 60) == "COMPLETED"
        print(f"{library}: {time.monotonic() - started:.0f} s from submit to COMPLETED")

        lines = metrics_lines(env_pool, job)
        starts = [m for m in lines if m["event"] == "start"]
        # one launch per shape, each at its plan's batch: the rebatch needed no relaunch
        assert [(m["gpus"], m["global_batch"]) for m in starts] == PHASES[:3]
        assert [m["resumed"] for m in starts] == [False, True, True]
        (rb,) = [m for m in lines if m["event"] == "rebatch"]
        assert (rb["from_batch"], rb["global_batch"]) == (64, 128)
        steps = [m for m in lines if m["event"] == "steps"]
        assert steps[-1]["global_batch"] == 128 and steps[-1]["per_gpu_batch"] == 16
        assert all(m["noise_scale"] is not None for m in steps if m["gpus"] > 1)
        assert [m["event"] for m in lines].count("done") == 1
        kinds = [d.action for d in ctl.store.decisions(job)]
        assert kinds.count("rebatch") == 1, kinds

        # the samples: each exactly once per epoch but in a step with fewer samples than
        # ranks, which trains at most W - 1 of them again (W <= 4)
        seen = records(record)
        if library == "lightning":  # Lightning counts epochs: check each
            for epoch in range(EPOCHS):
                got = Counter(i for r in seen if r["epoch"] == epoch for i in r["idx"])
                assert set(got) == set(range(SAMPLES)), f"epoch {epoch}: samples skipped"
                assert sum(got.values()) - SAMPLES <= 3, f"epoch {epoch}: {got.most_common(4)}"
        else:  # one stream over the epochs: only its very last step may repeat
            got = Counter(i for r in seen for i in r["idx"])
            assert set(got) == set(range(SAMPLES)) and min(got.values()) == EPOCHS
            assert sum(got.values()) - EPOCHS * SAMPLES <= 3, got.most_common(4)
        assert {r["launch"] for r in seen} == {0, 1, 2}
    finally:
        env_pool.run("scancel", f"--reservation={res}", check=False)
        time.sleep(1)
        env_pool.run("scontrol", "delete", "reservation", res, check=False)
