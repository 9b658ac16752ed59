"""A running job's global batch changes on the real pool without a restart: the controller
rewrites the plan (no Slurm call), the job trains at the new batch from the next step,
and every sample of every epoch is still seen exactly once."""

from __future__ import annotations

import getpass
import json
import os
import statistics
import time
from pathlib import Path

import pytest

from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.reconcile import Settings
from hpcorch.controller.store import Store
from hpcorch.policy.types import JobPlan, Plan, Snapshot
from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.cluster import SlurmCluster
from tests.conftest import Pool
from tests.integration.controller_util import ELASTIC, metrics_lines, wait_for

pytestmark = pytest.mark.slurm


class TwoGpus:
    """Every job on 2 GPUs of the first node, at the global batch ``self.batch``."""

    name = "fixed"

    def __init__(self) -> None:
        self.batch = 64

    def schedule(self, snapshot: Snapshot) -> Plan:
        b = self.batch
        return Plan(tuple(JobPlan(j.job_id, 2, {0: 2}, b, b // 2, 1) for j in snapshot.jobs))


def is_read(argv: list[str]) -> bool:
    """A Slurm command that only reads (the queue, the nodes, a reservation, limits)."""
    return argv[0] in ("squeue", "sinfo") or (len(argv) > 1 and argv[1] in ("show", "list"))


def test_a_running_job_changes_its_batch_without_a_restart(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-rebatch-{os.getpid()}"
    spool = Path(env_pool.env["HPCORCH_SPOOL"])  # where the wrapper looks for plans
    cluster = SlurmCluster(res, SlurmCLI(env=env_pool.env), spool=spool)
    cluster.ensure_reservation("n1", getpass.getuser(), None)
    policy = TwoGpus()
    # min_run_s and restart_cost_s 0: the policy may change the job as soon as it trains
    # (else a fresh launch is set apart until it trained that long: only a policy that
    # plans around such jobs, while others wait, changes its batch before)
    cfg = LoopConfig(round_s=0, restart_cost_s=0, settings=Settings(min_run_s=0))
    ctl = Controller(cluster, Store(tmp_path / "state.db"), policy, cfg, log=print)
    record = tmp_path / "seen"
    try:
        out = env_pool.hpcorch(
            "submit", "--pool", res, "--name", "rb", "--min-gpus", "2",
            "--max-gpus", "2", "--batch-size", "64", "--max-batch-size", "256",
            "--max-per-gpu-batch", "64", "--parsable", str(ELASTIC), "--global-batch", "64",
            "--samples", "1024", "--epochs", "3", "--sample-delay", "0.004",
            "--record", str(record),
        )  # fmt: skip
        job = int(out.stdout.strip())

        def steps_at(batch: int) -> int:
            ms = metrics_lines(env_pool, job)
            return sum(1 for m in ms if m.get("event") == "steps" and m["global_batch"] == batch)

        def cycle_until(what: str, cond: object, timeout: float) -> None:
            def step() -> bool:
                ctl.cycle()
                return bool(cond())  # type: ignore[operator]

            wait_for(what, step, timeout)

        cycle_until("the job training at 64", lambda: steps_at(64) >= 3, 240)
        policy.batch = 128
        ran: list[list[str]] = []
        run = cluster.backend.run

        def recorded(argv: list[str], *args: object, **kwargs: object) -> str:
            ran.append(list(argv))
            return run(argv, *args, **kwargs)  # type: ignore[arg-type]

        cluster.backend.run = recorded  # type: ignore[method-assign]
        written = time.time()
        ctl.cycle()
        cluster.backend.run = run  # type: ignore[method-assign]
        # the observation only (the queue as text, changed jobs' JSON, the nodes): no Slurm
        # call to rebatch
        assert ran and all(is_read(argv) for argv in ran), ran
        assert [d.action for d in ctl.store.decisions(job)][-1] == "rebatch"
        cycle_until("the job done", lambda: ctl.store.job(job).phase == "done", 300)  # type: ignore[union-attr]

        ms = metrics_lines(env_pool, job)
        assert [m["event"] for m in ms].count("start") == 1  # one launch: no restart
        (rb,) = [m for m in ms if m["event"] == "rebatch"]
        assert (rb["from_batch"], rb["global_batch"]) == (64, 128)
        # at the first step boundary after the plan was written
        steps = [m for m in ms if m["event"] == "steps"]
        step_time = statistics.median(m["step_time"] for m in steps if m["global_batch"] == 64)
        assert rb["time"] - written < 2 * step_time + 1.0, (rb, written, step_time)
        after = [m for m in steps if m["step"] > rb["step"]]
        assert after and {m["global_batch"] for m in after} == {128}
        # every sample of every epoch seen exactly once, over both ranks and both batches
        seen: dict[int, list[int]] = {}
        for rank in (0, 1):
            for line in record.with_suffix(f".{rank}.jsonl").read_text().splitlines():
                rec = json.loads(line)
                seen.setdefault(rec["epoch"], []).extend(rec["idx"])
        assert sorted(seen) == [0, 1, 2]
        for epoch, idx in seen.items():
            assert sorted(idx) == list(range(1024)), f"epoch {epoch}"
        plan = json.loads((spool / str(job) / "plan.json").read_text())  # the controller's copy
        assert plan["global_batch"] == 128
    finally:
        env_pool.run("scancel", f"--reservation={res}", check=False)
        time.sleep(1)
        env_pool.run("scontrol", "delete", "reservation", res, check=False)
