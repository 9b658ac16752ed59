"""Memory on a pool that schedules it (issue 33, item 5): ``SelectTypeParameters=
CR_Core_Memory``, every node 16000 MB, ``DefMemPerGPU=4000`` (slurm/pool up --memory).
Every path by which the controller reshapes a job (its first launch, a shrink onto an
uneven placement, a grow, a drain that leaves it on its other node, a relaunch after a
node failure, a move to another node) leaves it holding exactly its GPUs' memory on every
node, as ``scontrol show -d job`` reports it: the GPUs there times its ``--mem-per-gpu``
(hpcorch-alice's job) or the site's ``DefMemPerGPU`` (hpcorch-bob's, which asks none).
Jobs of real second Unix users, the controller as the shipped unit runs it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from hpcorch import hostlist
from tests.conftest import Pool
from tests.integration.controller_util import wait_for
from tests.integration.site_jobs import Host, make_reservation, shared_spool, submit
from tests.integration.users import ALICE, BOB, Site, site_beside

pytestmark = [pytest.mark.slurm, pytest.mark.releases]

ALICE_MB = 1500
"""hpcorch-alice's --mem-per-gpu."""
DEFAULT_MB = 4000
"""The pool's DefMemPerGPU (16000 MB per node, 4 GPUs): what hpcorch-bob's jobs get."""

NODE_LINE = re.compile(
    r"^\s*Nodes=(\S+) CPU_IDs=\S+ Mem=(\d+) GRES=(?:gres/)?gpu(?::[^:(\s]+)?:(\d+)", re.M
)
JOB_MEM = re.compile(r"(?:^|\s)(?:Alloc)?TRES=\S*?\bmem=([0-9.]+)([MGT])")


@pytest.fixture(scope="module")
def site(slurm_pool: Pool) -> Iterator[Site]:
    with site_beside(slurm_pool, 90, memory=True) as s:
        yield s


def allocation(s: Site, job: int) -> dict[str, tuple[int, int]]:
    """node -> (GPUs, MB) the job holds there while it runs ({} otherwise), from
    ``scontrol show -d job``; checked against the job's whole memory (its TRES)."""
    out = s.slurm("scontrol", "show", "-d", "job", str(job)).stdout
    if not re.search(r"\bJobState=RUNNING\b", out):
        return {}
    held = {
        node: (int(m.group(3)), int(m.group(2)))
        for m in NODE_LINE.finditer(out)
        for node in hostlist.expand(m.group(1))
    }
    total = JOB_MEM.search(out)
    assert total is not None, out
    scale = {"M": 1, "G": 1024, "T": 1024 * 1024}[total.group(2)]
    assert round(float(total.group(1)) * scale) == sum(mb for _, mb in held.values()), out
    return held


def gpus(s: Site, job: int) -> list[int]:
    """The job's GPUs on each of its nodes, fewest first ([] unless it runs)."""
    return sorted(g for g, _ in allocation(s, job).values())


def holds_its_gpus_memory(s: Site, job: int, per_gpu: int) -> dict[str, tuple[int, int]]:
    held = allocation(s, job)
    assert held, f"job {job} is not running"
    assert held == {n: (g, g * per_gpu) for n, (g, _) in held.items()}, (
        f"job {job} holds {held}, not {per_gpu} MB per GPU"
    )
    return held


def test_every_resize_leaves_a_job_holding_its_gpus_memory(site: Site) -> None:
    """hpcorch-alice's elastic job (1-8 GPUs, --mem-per-gpu=1500) and hpcorch-bob's fixed
    ones (DefMemPerGPU) through each resize path; after each, every node's memory is its
    GPUs' there."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    host = Host(site, "host-memory", "open", spool, "--nodes", "n1,n2")
    host.start()
    mem = [f"--sbatch-arg=--mem-per-gpu={ALICE_MB}"]
    log = host.log
    try:
        a = submit(site, ALICE, "open", 1, 8, "good", spool=spool, options=mem)
        wait_for("alice's job on 4 + 4 GPUs", lambda: gpus(site, a) == [4, 4], 120, log)
        holds_its_gpus_memory(site, a, ALICE_MB)

        # shrink onto an uneven placement, beside a job with the site's default
        b = submit(site, BOB, "open", 2, 2, "good", spool=spool)
        wait_for("alice's job on 4 + 2", lambda: gpus(site, a) == [2, 4], 120, log)
        wait_for("bob's job on 2", lambda: gpus(site, b) == [2], 60, log)
        holds_its_gpus_memory(site, a, ALICE_MB)
        holds_its_gpus_memory(site, b, DEFAULT_MB)

        # grow back once bob's job has ended
        site.as_user(BOB, "scancel", str(b))
        wait_for("alice's job back on 4 + 4", lambda: gpus(site, a) == [4, 4], 120, log)
        holds_its_gpus_memory(site, a, ALICE_MB)

        # a drain: the job leaves n2 at its next checkpoint, onto n1
        site.slurm("scontrol", "update", "nodename=n2", "state=drain", "reason=memtest")
        wait_for("alice's job on n1 only", lambda: set(allocation(site, a)) == {"n1"}, 120, log)
        assert holds_its_gpus_memory(site, a, ALICE_MB) == {"n1": (4, 4 * ALICE_MB)}
        site.slurm("scontrol", "update", "nodename=n2", "state=resume")
        wait_for("alice's job on both again", lambda: gpus(site, a) == [4, 4], 120, log)
        holds_its_gpus_memory(site, a, ALICE_MB)

        # a node failure: Slurm requeues the job, the controller relaunches it on n2
        site.slurm("scontrol", "update", "nodename=n1", "state=down", "reason=memtest")
        wait_for("alice's job relaunched on n2", lambda: set(allocation(site, a)) == {"n2"},
                 120, log)  # fmt: skip
        assert holds_its_gpus_memory(site, a, ALICE_MB) == {"n2": (4, 4 * ALICE_MB)}
        site.slurm("scontrol", "update", "nodename=n1", "state=resume")
        site.as_user(ALICE, "scancel", str(a))

        # a move: bob's 2-GPU job leaves a drained node for the other one
        c = submit(site, BOB, "open", 2, 2, "good", spool=spool)
        wait_for("bob's job on 2", lambda: gpus(site, c) == [2], 120, log)
        (first,) = holds_its_gpus_memory(site, c, DEFAULT_MB)
        other = "n1" if first == "n2" else "n2"
        site.slurm("scontrol", "update", f"nodename={first}", "state=drain", "reason=memtest")
        wait_for(f"bob's job moved to {other}", lambda: set(allocation(site, c)) == {other},
                 120, log)  # fmt: skip
        assert holds_its_gpus_memory(site, c, DEFAULT_MB) == {other: (2, 2 * DEFAULT_MB)}
        assert "Traceback" not in host.text()
    finally:
        for node in ("n1", "n2"):
            site.slurm("scontrol", "update", f"nodename={node}", "state=resume")
        site.slurm("scancel", "--reservation=open")
        host.stop()
