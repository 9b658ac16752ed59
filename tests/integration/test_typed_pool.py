"""GPU types on a real pool of two generations (``slurm/pool up --gpu-types t4:2,a100:2``):
a job submitted with ``--gpu-types a100`` is started by the controller on an a100 node
with exactly its GPUs and CPUs, its request naming the type (``gres:gpu:a100:N``; 22.05:
the nodes do), and ``hpcorch status`` and ``hpcorch report`` say where it ran; a type the
pool lacks is refused at submit. A second user's job moved from a100 to t4 at the same
count, as the controller reshapes it, holds exactly 2 t4 GPUs and their CPUs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.version import behaviour
from tests.conftest import (
    POOL_SCRIPT,
    Pool,
    _slurm_installed,
    pool_env,
    pool_port_base,
    slurm_release,
)
from tests.integration.controller_util import FAST, ControllerProc, wait_for
from tests.integration.users import world_dir

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


@pytest.fixture(scope="module")
def typed_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """Four nodes of 2 GPUs: n1, n2 of type t4 and n3, n4 of type a100 (port base + 300:
    the blocks below are the other test pools')."""
    if not _slurm_installed():
        pytest.skip("Slurm is not installed (slurm/pool install)")
    # a directory every user can pass through: a second user's sbatch reads its slurm.conf
    root = world_dir("hpcorch-typed-")
    pdir = root / "pool"
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pdir)}
    up = subprocess.run(
        [str(POOL_SCRIPT), "up", "--nodes", "4", "--gpus-per-node", "2", "--gpu-types",
         "t4:2,a100:2", "--port-base", str(pool_port_base() + 300), "--slurm",
         slurm_release()],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr[-2000:]
    env = pool_env(env)
    home = tmp_path_factory.mktemp("typed-home")
    env.update(HPCORCH_HOME=str(home), HPCORCH_SPOOL=str(home / "spool"), PYTHONUNBUFFERED="1")
    try:
        yield Pool(dir=pdir, env=env, nodes=4, gpus_per_node=2, home=home)
    finally:
        subprocess.run([str(POOL_SCRIPT), "down"], env=env, check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_an_a100_job_runs_on_a100_with_a_typed_request(typed_pool: Pool, tmp_path: Path) -> None:
    pool, res = typed_pool, f"t-types-{os.getpid()}"
    ctl = ControllerProc(pool, tmp_path / "ctl", res, "--nodes", "n[1-4]", "--policy", "share",
                         *FAST)  # fmt: skip
    sleeper = tmp_path / "sleeper.sh"
    sleeper.write_text("#!/bin/sh\nsleep 300\n")
    sleeper.chmod(0o755)
    ctl.start()
    try:
        bad = pool.hpcorch("submit", "--pool", res, "--min-gpus", "1", "--gpu-types", "h100",
                           str(sleeper), check=False)  # fmt: skip
        assert bad.returncode == 1 and "Traceback" not in bad.stderr
        assert bad.stderr.strip().splitlines()[-1] == (
            f"Error: --gpu-types: pool '{res}' has no GPU type h100 (valid: a100, t4)"
        )
        out = pool.hpcorch("submit", "--pool", res, "--name", "on-a100", "--min-gpus", "1",
                           "--max-gpus", "2", "--gpu-types", "a100", "--mode", "managed",
                           "--parsable", str(sleeper))  # fmt: skip
        job = int(out.stdout)
        shown = pool.run("squeue", "-h", "-j", str(job), "-o", "%k").stdout
        assert "types=a100" in shown  # the comment carries it
        wait_for("the job running", lambda: pool.state(job) == "RUNNING", 90, ctl.log)
        nodes = pool.run("squeue", "-h", "-j", str(job), "-o", "%N").stdout.strip()
        assert nodes in ("n3", "n4", "n[3-4]"), nodes
        print(pool.run("scontrol", "show", "-d", "job", str(job)).stdout)  # kept in the output
        # exactly the CPUs and GPUs of its shape: a100 GPUs, each with its node's share of
        # the CPUs (the a100 nodes n3 and n4 are alike), asked for as this release allows
        held, cpus, request = _holds(pool, job)
        assert {(node, kind) for node, kind, _ in held} <= {("n3", "a100"), ("n4", "a100")}
        assert cpus == sum(n for *_, n in held) * _per_gpu(pool, "n3"), held
        assert request == _request(pool, "a100", held[0][2])
        wait_for("the controller to see it run", lambda: ctl.phase(job) == "running", 30)
        store = ctl.store()
        rec = store.job(job)
        store.close()
        assert rec is not None and (rec.gpu_types, rec.gpu_type, rec.target_type) == (
            "a100",
            "a100",
            "a100",
        )
        status = pool.hpcorch("status", "--state-dir", str(ctl.state)).stdout.splitlines()
        head = next(ln.split() for ln in status if ln.startswith("JOBID"))
        row = next(ln.split() for ln in status if ln.startswith(str(job)))
        assert row[head.index("TYPE")] == "a100", status
        pool.hpcorch("cancel", str(job))
        wait_for("the job cancelled", lambda: ctl.phase(job) == "cancelled", 30, ctl.log)
        report = pool.hpcorch("report", "--state-dir", str(ctl.state)).stdout.splitlines()
        assert report[0].split()[-1] == "GPU_TYPES", report
        line = next(ln.split() for ln in report if ln.startswith(str(job)))
        assert line[-1] == "a100", report
    finally:
        assert ctl.stop() == 0
        pool.run("scancel", f"--reservation={res}", check=False)
        pool.run("scontrol", "delete", "reservation", res, check=False)


def _per_gpu(pool: Pool, node: str) -> int:
    """A GPU's share of ``node``'s CPUs (CPUTot / its GPUs): the site default per GPU."""
    text = pool.run("scontrol", "-o", "show", "node", node).stdout
    cpus = int(re.search(r"CPUTot=(\d+)", text)[1])  # type: ignore[index]
    return cpus // int(re.search(r"Gres=gpu:\w+:(\d+)", text)[1])  # type: ignore[index]


def _holds(pool: Pool, job: int) -> tuple[list[tuple[str, str, int]], int, str]:
    """What ``job`` holds, as ``scontrol show -d job`` shows it: (node, GPU type, GPUs) that
    Slurm allocated on each node, its CPUs, and its GPU request (``TresPerNode``)."""
    detail = pool.run("scontrol", "show", "-d", "job", str(job)).stdout
    held = re.findall(r"Nodes=(\w+) CPU_IDs=\S+ Mem=\d+ GRES=gpu:(\w+):(\d+)\(IDX", detail)
    assert held, detail
    cpus = int(re.search(r"NumCPUs=(\d+)", detail)[1])  # type: ignore[index]
    request = re.search(r"TresPerNode=(\S+)", detail)[1]  # type: ignore[index]
    return [(n, t, int(c)) for n, t, c in held], cpus, request.replace("gres/", "gres:")


def _request(pool: Pool, kind: str, gpus: int) -> str:
    """The GPU request per node a launch of ``gpus`` GPUs of ``kind`` makes on this pool's
    release: its type named, except on 22.05 (``SlurmBehaviour.retypes_gpus``)."""
    rules = behaviour(SlurmCLI(env=pool.env).version())
    return f"gres:gpu:{kind}:{gpus}" if rules.retypes_gpus else f"gres:gpu:{gpus}"


def _running(pool: Pool, job: int) -> None:
    """Wait until ``job`` runs; fail at once if Slurm finds it never runnable."""

    def up() -> bool:
        state, reason = pool.run("squeue", "-h", "-j", str(job), "-o", "%T %r").stdout.split()
        assert reason != "BadConstraints", pool.run("scontrol", "show", "job", str(job)).stdout
        return state == "RUNNING"

    wait_for(f"job {job} running", up, 60)


def test_a_move_between_types_at_the_same_count_holds_the_new_shape(typed_pool: Pool) -> None:
    """What the controller asks of Slurm when a plan moves a job to another type at the
    same GPU count, for a job of a second Unix user: its launch on an a100 node requeued
    held and reshaped onto a t4 node (``set_shape``, as the controller's backend does on
    this release), the job runs there with exactly 2 t4 GPUs and their CPUs. Slurm 22.05
    never runs a requeued job whose typed request changed type (BadConstraints): there the
    request names no type and the planned nodes decide it."""
    pool, user = typed_pool, "hpcorch-alice"
    if os.geteuid() != 0 or subprocess.run(["id", user], capture_output=True).returncode:
        pytest.skip(f"needs root and the user {user} (tests/integration/users.py)")
    work = world_dir("hpcorch-move-")
    shutil.chown(work, user, user)  # the job's own directory: it writes its output there
    script = work / "sleeper.sh"
    script.write_text("#!/bin/sh\nsleep 300\n")
    script.chmod(0o755)
    out = pool.run(
        "setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "sbatch",
        "--parsable", "--hold", f"--chdir={work}", f"--output={work}/out", "--gres=gpu:1",
        str(script),
    )  # fmt: skip
    job = int(out.stdout.strip().split(";")[0])
    cli = SlurmCLI(env=pool.env)
    cli.use(behaviour(cli.version()))  # as the controller's backend
    try:
        cpus = _per_gpu(pool, "n3")
        assert cpus == _per_gpu(pool, "n1")  # the same CPUs per GPU on both types' nodes
        cli.set_shape(job, 1, 2, ["n3"], cpus_per_gpu=cpus, gpu_type="a100")
        cli.release(job)
        _running(pool, job)
        # exactly its GPUs and their CPUs
        assert _holds(pool, job) == ([("n3", "a100", 2)], 2 * cpus, _request(pool, "a100", 2))
        assert pool.run("squeue", "-h", "-j", str(job), "-o", "%u").stdout.strip() == user
        cli.requeue_hold(job)  # as a checkpointed launch leaves it: held, to be reshaped
        pool.wait_state(job, {"PENDING"})
        cli.set_shape(job, 1, 2, ["n1"], cpus_per_gpu=cpus, gpu_type="t4")
        cli.start_now(job)  # a requeued job's begin time is later: the controller clears it
        cli.release(job)
        _running(pool, job)
        assert _holds(pool, job) == ([("n1", "t4", 2)], 2 * cpus, _request(pool, "t4", 2))
    finally:
        pool.run("scancel", str(job), check=False)
        shutil.rmtree(work, ignore_errors=True)
