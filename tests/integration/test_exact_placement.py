"""Exact placements on the real pool: a plan of 4 GPUs on n2 and 2 on n1 (ranks on n2
first) runs as exactly that: Slurm allocates 4+2, the ranks are laid out in the planned
order, and a real DDP job trains across them."""

from __future__ import annotations

import getpass
import json
import os
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
from tests.integration.controller_util import job_dir, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.releases]

PROBE = Path(__file__).parent / "rank_probe.py"


class FourOnN2TwoOnN1:
    """The 6-GPU job: 4 GPUs on the pool's second node, then 2 on its first; the 2-GPU
    job: the other 2 of the first node."""

    name = "fixed"

    def schedule(self, snapshot: Snapshot) -> Plan:
        plans = []
        for j in snapshot.jobs:
            if j.min_gpus == 6:
                plans.append(JobPlan(j.job_id, 6, {1: 4, 0: 2}, 12, 2, 1))
            else:
                plans.append(JobPlan(j.job_id, 2, {0: 2}, 2, 1, 1))
        return Plan(tuple(plans))


def test_a_4_plus_2_plan_runs_as_4_plus_2_in_the_planned_rank_order(
    env_pool: Pool, tmp_path: Path
) -> None:
    """A 6-GPU job planned as 4 on n2 + 2 on n1 (ranks on n2 first) and a 2-GPU job planned
    on n1's other two GPUs start in the same cycle. While n1 is all free, Slurm would put 4
    of the 6 there: the 6-GPU job waits until the other job holds its two, then Slurm can
    only place it as planned."""
    res = f"t-exact-{os.getpid()}"
    spool = Path(env_pool.env["HPCORCH_SPOOL"])  # where the wrapper looks for plans
    cluster = SlurmCluster(res, SlurmCLI(env=env_pool.env), spool=spool)
    cluster.ensure_reservation("n1,n2", getpass.getuser(), None)
    cfg = LoopConfig(round_s=0, settings=Settings(min_run_s=0, exact_wait_s=300))
    ctl = Controller(cluster, Store(tmp_path / "state.db"), FourOnN2TwoOnN1(), cfg, log=print)
    sleeper = tmp_path / "sleeper.sh"
    sleeper.write_text("#!/bin/sh\nsleep 600\n")
    sleeper.chmod(0o755)
    try:

        def submit(script: str, *args: str) -> int:
            out = env_pool.hpcorch("submit", *args, "--pool", res, "--parsable", script)
            return int(out.stdout)

        job = submit(
            str(PROBE), "--name", "probe", "--min-gpus", "6", "--max-gpus", "6",
            "--batch-size", "12", "--max-per-gpu-batch", "2", "--cpus-per-gpu", "1",
        )  # fmt: skip
        other = submit(
            str(sleeper), "--name", "other", "--min-gpus", "2", "--max-gpus", "2",
            "--batch-size", "2", "--max-per-gpu-batch", "1", "--mode", "managed",
        )  # fmt: skip
        ctl.cycle()
        rec = ctl.store.job(job)
        assert rec is not None and rec.phase == "starting", rec
        assert "leave one split" in rec.reason and env_pool.state(job) == "PENDING"

        def done() -> bool:
            ctl.cycle()
            r = ctl.store.job(job)
            return r is not None and r.phase in ("done", "failed")

        wait_for("the probe to finish", done, 300)
        rec = ctl.store.job(job)
        assert rec is not None and rec.phase == "done", rec
        assert (rec.node_list, rec.node_gpus) == ("n1,n2", "2,4")  # as Slurm reported it
        assert ctl.store.job(other).node_list == "n1"  # type: ignore[union-attr]
        ranks = [
            json.loads((job_dir(env_pool, job) / "ranks" / f"{r}.json").read_text())
            for r in range(6)
        ]
        assert [(r["node"], r["local_rank"], r["local_world"]) for r in ranks] == [
            ("n2", 0, 4), ("n2", 1, 4), ("n2", 2, 4), ("n2", 3, 4), ("n1", 0, 2), ("n1", 1, 2)
        ]  # fmt: skip
        assert {r["world"] for r in ranks} == {6}
        assert [r["gpus_on_node"] for r in ranks] == [4, 4, 4, 4, 2, 2]
        assert {r["cpus_per_gpu"] for r in ranks} == {1}
        log = next(job_dir(env_pool, job).glob("slurm-*.out")).read_text()
        assert "6 tasks on n2:4 n1:2 (ranks in that order)" in log, log[-2000:]
    finally:
        env_pool.run("scancel", f"--reservation={res}", check=False)
        time.sleep(1)
        env_pool.run("scontrol", "delete", "reservation", res, check=False)
