"""Launch detection (torchrun, srun, MPI) and settings precedence: plan > env > script."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from hpcorch.planner import LaunchPlan, write_plan
from hpcorch.runtime.config import ConfigError, parse_signals, resolve
from hpcorch.runtime.dist import LaunchError, detect_launch


def test_torchrun_environment() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "SLURM_PROCID": "0",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("env", 3, 4, 1)
    assert (info.master_addr, info.master_port, info.local_world_size) == ("10.0.0.1", 29500, 2)


def test_srun_environment() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_STEP_NUM_TASKS": "6",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
        "SLURM_JOB_ID": "17",
        "MASTER_ADDR": "127.0.0.1",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size) == ("slurm", 5, 6)
    assert (info.local_rank, info.local_world_size) == (1, 2)
    assert info.master_addr == "127.0.0.1" and 20000 <= (info.master_port or 0) < 40000


def test_mpi_environment_is_detected_before_srun() -> None:
    env = {
        "SLURM_PROCID": "1",
        "PMIX_RANK": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_ID": "3",
        "MASTER_ADDR": "127.0.0.1",
    }
    assert detect_launch(env).launcher == "mpi"
    assert detect_launch(env, "slurm").launcher == "slurm"


def test_single_process_needs_nothing() -> None:
    info = detect_launch({})
    assert (info.rank, info.world_size, info.master_addr) == (0, 1, "127.0.0.1")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "outside"),
        ({"HPCORCH_LAUNCHER": "pbs"}, "valid: auto, env, slurm, mpi"),
    ],
)
def test_bad_launch_environment(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect_launch(env)


def test_signals() -> None:
    assert parse_signals("USR2") == (signal.SIGUSR2,)
    assert parse_signals("SIGUSR2, term") == (signal.SIGUSR2, signal.SIGTERM)
    assert parse_signals(str(int(signal.SIGUSR1))) == (signal.SIGUSR1,)
    with pytest.raises(ConfigError, match="unknown signal 'USR3'"):
        parse_signals("USR3")
    with pytest.raises(ConfigError, match="cannot be caught"):
        parse_signals("KILL")


def settings(env: dict[str, str], **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        world_size=2,
        global_batch=64,
        max_micro_batch=16,
        lr_scaling="sqrt",
        min_global_batch=None,
        max_global_batch=None,
        job_dir=None,
        checkpoint_signal=None,
        checkpoint_interval=None,
        metrics_interval=None,
    )
    args.update(kw)
    return resolve(env, **args)


def test_precedence_plan_over_env_over_script(tmp_path: Path) -> None:
    s = settings({"HPCORCH_JOB_DIR": str(tmp_path)})
    assert s.batch.describe() == "64 = 16 x 2 x 2" and s.plan_path is None
    s = settings({"HPCORCH_JOB_DIR": str(tmp_path), "HPCORCH_GLOBAL_BATCH": "128"})
    assert s.batch.describe() == "128 = 16 x 4 x 2"
    write_plan(tmp_path / "plan.json", LaunchPlan(256, 2, 64, job="j", lr_scaling="linear"))
    s = settings({"HPCORCH_JOB_DIR": str(tmp_path), "HPCORCH_GLOBAL_BATCH": "128"})
    assert s.batch.describe() == "256 = 64 x 2 x 2"
    assert (s.lr_scaling, s.job_id, s.plan_path) == ("linear", "j", tmp_path / "plan.json")


def test_bounds_apply_to_the_plan(tmp_path: Path) -> None:
    write_plan(tmp_path / "p.json", LaunchPlan(4096, 2, 64))
    s = settings({"HPCORCH_PLAN": str(tmp_path / "p.json")}, max_global_batch=512)
    assert (s.requested_batch, s.batch.global_batch) == (4096, 512)
    env = {"HPCORCH_PLAN": str(tmp_path / "p.json"), "HPCORCH_MAX_GLOBAL_BATCH": "256"}
    assert settings(env, max_global_batch=512).batch.global_batch == 256
    write_plan(tmp_path / "p.json", LaunchPlan(8, 2, 64))
    env = {"HPCORCH_PLAN": str(tmp_path / "p.json"), "HPCORCH_MIN_GLOBAL_BATCH": "32"}
    assert settings(env).batch.global_batch == 32


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HPCORCH_GLOBAL_BATCH": "lots"}, "HPCORCH_GLOBAL_BATCH='lots' is not an integer"),
        ({"HPCORCH_GLOBAL_BATCH": "1"}, "cannot plan the batch"),
        ({"HPCORCH_CKPT_INTERVAL": "-3"}, "must be >= 0"),
        ({"HPCORCH_PLAN": "/nonexistent/plan.json"}, "cannot read plan"),
        ({"HPCORCH_CKPT_SIGNAL": "BOGUS"}, "unknown signal"),
    ],
)
def test_bad_settings(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings(env)


def test_plan_of_another_job(tmp_path: Path) -> None:
    write_plan(tmp_path / "plan.json", LaunchPlan(64, 2, 16, job="other"))
    with pytest.raises(ConfigError, match="is for job 'other', not for 'mine'"):
        settings({"HPCORCH_JOB_DIR": str(tmp_path), "HPCORCH_JOB_ID": "mine"})


@pytest.mark.parametrize(("node", "local_world"), [(0, 2), (2, 2), (3, 1)])
def test_uneven_tasks_per_node(node: int, local_world: int) -> None:
    """``2(x3),1``: three nodes with two tasks, one with one; srun and MPI agree."""
    env = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node),
        "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
        "SLURM_JOB_ID": "17",
        "MASTER_ADDR": "127.0.0.1",
    }
    assert detect_launch(env).local_world_size == local_world
    mpi = {**env, "PMIX_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "7"}
    assert detect_launch(mpi).local_world_size == local_world
    with pytest.raises(LaunchError, match="tasks-per-node"):
        detect_launch({**env, "SLURM_STEP_TASKS_PER_NODE": "2(x3),"})
