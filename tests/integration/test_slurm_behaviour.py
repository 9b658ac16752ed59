"""Every Slurm behaviour hpcorch relies on, checked against the real daemons of the release
the test pool runs ($HPCORCH_SLURM: 22.05, 23.11, 24.11, 25.11). Each test is a row of the
admin guide's table "Slurm behaviours hpcorch relies on" (docs/admin-guide.md), and
``hpcorch.slurm.version.behaviour`` must say the same as the daemons do."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from hpcorch.slurm.backend import SlurmCLI, shape_args
from hpcorch.slurm.version import behaviour, check_supported
from tests.conftest import Pool, slurm_release
from tests.integration.controller_util import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.releases]

RES = "t-behaviour"


@pytest.fixture
def cli(slurm_pool: Pool) -> SlurmCLI:
    backend = SlurmCLI(env=slurm_pool.env)
    backend.use(behaviour(backend.version()))
    return backend


@pytest.fixture
def resv(slurm_pool: Pool, cli: SlurmCLI) -> Iterator[str]:
    """A one-node reservation as the controller makes it (IGNORE_JOBS, ten years)."""
    slurm_pool.run("scontrol", "delete", "reservation", RES, check=False)
    cli.create_reservation(RES, "n4", "root", "gpu")
    yield RES
    slurm_pool.run("scancel", f"--reservation={RES}", check=False)
    time.sleep(1)
    slurm_pool.run("scontrol", "delete", "reservation", RES, check=False)


def sbatch(pool: Pool, *args: str) -> int:
    return int(pool.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0])


def show(pool: Pool, job: int) -> dict[str, str]:
    out = pool.run("scontrol", "-o", "show", "job", str(job)).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_release_is_the_one_asked_for_and_supported(cli: SlurmCLI) -> None:
    version = check_supported(cli.version())
    assert version.series == slurm_release()[:5]


def test_squeue_lists_an_ended_job_only_as_the_release_says(slurm_pool: Pool) -> None:
    job = sbatch(slurm_pool, "--gres=gpu:1", "--wrap", "exit 75")
    wait_for("the job to end", lambda: slurm_pool.state(job) == "FAILED", 60)
    plain = json.loads(slurm_pool.run("squeue", "--json").stdout)["jobs"]
    listed = job in {j["job_id"] for j in plain}
    b = behaviour(SlurmCLI(env=slurm_pool.env).version())
    assert listed is not b.squeue_lists_ended_only_when_asked
    # what the controller reads: the ended job with its exit code, on every release
    (seen,) = [j for j in SlurmCLI(env=slurm_pool.env).jobs() if j.job_id == job]
    assert (seen.state, seen.exit_code) == ("FAILED", 75)


def test_exit_75_then_requeuehold_keeps_the_job_and_its_id(slurm_pool: Pool, cli: SlurmCLI) -> None:
    """A run that exits 75 ends FAILED (sbatch --requeue does not requeue a non-zero exit);
    requeue-held, it is the same job, pending and held, one restart on; released, it runs."""
    again = '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || exit 75'
    job = sbatch(slurm_pool, "--requeue", "--gres=gpu:1", "--wrap", again)
    wait_for("exit 75", lambda: slurm_pool.state(job) == "FAILED", 60)
    cli.requeue_hold(job)
    seen = slurm_pool.squeue()[job]
    assert (seen.state, seen.held, seen.restarts) == ("PENDING", True, 1)
    time.sleep(1.1)  # slurmd refuses a credential made in the second it revoked the last
    cli.start_now(job)
    cli.release(job)
    wait_for("the relaunch to finish", lambda: slurm_pool.state(job) == "COMPLETED", 60)
    assert slurm_pool.squeue()[job].restarts == 1


def test_hold_kinds(slurm_pool: Pool, cli: SlurmCLI) -> None:
    """sbatch --hold is a user hold; scontrol hold by an operator (root here) an admin hold,
    which the job's owner cannot release on any release (docs/admin-guide.md)."""
    job = sbatch(slurm_pool, "--hold", "--gres=gpu:1", "--wrap", "sleep 60")
    assert show(slurm_pool, job)["Reason"] == "JobHeldUser"
    cli.release(job)
    cli.hold(job)
    assert show(slurm_pool, job)["Reason"] == "JobHeldAdmin"
    slurm_pool.run("scancel", str(job))


def test_reservation_flags_and_end_as_the_controller_sets_them(
    slurm_pool: Pool, cli: SlurmCLI, resv: str
) -> None:
    r = cli.reservation(resv)
    assert "IGNORE_JOBS" in r.flags and r.nodes == "n4"
    assert r.end_time - time.time() > 9 * 365 * 86400  # ten years, not Slurm's 365 days
    end = time.time() + 30 * 86400
    cli.extend_reservation(resv, end)
    assert abs(cli.reservation(resv).end_time - end) < 61


def test_json_schemas_parse(slurm_pool: Pool, cli: SlurmCLI) -> None:
    nodes = {n.name: n for n in cli.nodes()}
    assert set(nodes) >= {"n1", "n2", "n3", "n4"}
    assert {n.gpus for n in nodes.values()} == {4} and {n.cpus for n in nodes.values()} == {8}
    doc = json.loads(slurm_pool.run("squeue", "--json", "--states=all").stdout)
    parser = doc.get("meta", {}).get("plugin", {}).get("data_parser") or doc.get("meta", {}).get(
        "plugins", {}
    ).get("data_parser")
    # 22.05 writes the OpenAPI plugin, 23.02+ the data_parser version
    assert parser or slurm_release().startswith("22.05"), doc.get("meta")


@pytest.mark.parametrize(("first", "then"), [(4, 2), (1, 4), (4, 1)])
def test_reshape_holds_exactly_the_cpus_of_the_new_shape(
    slurm_pool: Pool, cli: SlurmCLI, resv: str, first: int, then: int
) -> None:
    """A job started at ``first`` GPUs x 2 CPUs, requeued held and reshaped the way the
    controller reshapes (shape_args), runs at once with exactly ``then`` x 2 CPUs."""
    job = sbatch(
        slurm_pool,
        "--hold",
        "--requeue",
        f"--reservation={resv}",
        f"--gres=gpu:{first}",
        f"--mincpus={2 * first}",
        "--wrap",
        "sleep 2; exit 75",
    )
    slurm_pool.run("scontrol", "update", f"jobid={job}", *shape_args(1, first, (), 2))
    cli.release(job)
    wait_for("the first run", lambda: slurm_pool.state(job) in ("RUNNING", "FAILED"), 60)
    assert show(slurm_pool, job)["NumCPUs"] == str(2 * first)
    wait_for("exit 75", lambda: slurm_pool.state(job) == "FAILED", 60)
    cli.requeue_hold(job)
    slurm_pool.run("scontrol", "update", f"jobid={job}", *shape_args(1, then, (), 2))
    time.sleep(1.1)
    cli.start_now(job)
    cli.release(job)
    wait_for(
        "the reshaped run",
        lambda: (
            slurm_pool.state(job) in ("RUNNING", "FAILED")
            and show(slurm_pool, job).get("Restarts") == "1"
        ),
        30,
    )
    got = show(slurm_pool, job)
    assert got["NumCPUs"] == str(2 * then), got
    assert f"gpu={then}" in got.get("AllocTRES", "") or f"gpu:{then}" in got["TresPerNode"]


def test_cpus_per_gpu_sticks_as_the_release_says(
    slurm_pool: Pool, cli: SlurmCLI, resv: str
) -> None:
    """Why reshapes never use CpusPerTres: a job first scheduled at 4 GPUs x 2 CPUs per GPU
    and reshaped to 2 GPUs through CpusPerTres stays pending for Resources on an idle node
    where the release keeps the first total (``cpus_per_gpu_sticks``), and runs elsewhere."""
    job = sbatch(
        slurm_pool,
        "--requeue",
        f"--reservation={resv}",
        "--gres=gpu:4",
        "--cpus-per-gpu=2",
        "--wrap",
        "sleep 2; exit 75",
    )
    wait_for("exit 75", lambda: slurm_pool.state(job) == "FAILED", 60)
    cli.requeue_hold(job)
    update = ["NumNodes=1-1", "TresPerNode=gres:gpu:2", "CpusPerTres=gres:gpu:2", "MinCPUsNode=4"]
    slurm_pool.run("scontrol", "update", f"jobid={job}", *update)
    time.sleep(1.1)
    cli.start_now(job)
    cli.release(job)
    deadline = time.time() + 15
    while time.time() < deadline and slurm_pool.state(job) == "PENDING":
        time.sleep(0.5)
    sticks = behaviour(cli.version()).cpus_per_gpu_sticks
    got = show(slurm_pool, job)
    assert (got["JobState"] == "PENDING") is sticks, got
    if sticks:
        assert got["Reason"] == "Resources"
