"""What a job reports never outranks Slurm, on a real pool with two real Unix users.

hpcorch-alice runs three colluding jobs on one GPU each: besides a few lines at the shape
Slurm gave them (with 100x bob's throughput), they write 349 steps lines claiming 2-8 GPUs.
hpcorch-bob runs the same model honestly. The controller stores every sample at Slurm's
shape and none of the forged ones, says so once per job, and alice's jobs never join the
group of bob's model key: not by default (keys per owner), and not with the site's opt-in
(``--pool-models-across-users``), where the owners' measurements disagree."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcorch.controller.snapshot import job_view
from hpcorch.controller.store import Store
from hpcorch.policy.pooling import model_keys
from tests.conftest import Pool
from tests.integration.controller_util import FAST, ControllerProc, wait_for
from tests.integration.test_trust import drop_reservation, reservation, site_pool
from tests.integration.users import ALICE, BOB, PYTHON, Site, site_beside

pytestmark = pytest.mark.slurm

FORGE = """\
import itertools, json, os, sys, time

job_dir, role, forged = sys.argv[1], sys.argv[2], int(sys.argv[3])
launch = int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def put(**line):
    line.update(time=time.time(), launch=launch)
    with open(os.path.join(job_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\\n")


put(event="start", epochs=3, dataset_size=1000, model="Net", params=250, model_bytes=1000)
if role == "honest":
    for i in range(40):
        put(event="steps", step=i + 1, step_time=0.5, gpus=1, per_gpu_batch=8,
            global_batch=8, samples_per_s=16.0)
claims = itertools.cycle(range(2, 9))
for i in range(forged):
    put(event="steps", step=i + 1, step_time=0.001, gpus=next(claims), per_gpu_batch=64,
        global_batch=512, samples_per_s=512000.0)
    if i % 10 == 0:  # at the shape Slurm gave it, lying about its throughput alone
        put(event="steps", step=i + 1, step_time=0.005, gpus=1, per_gpu_batch=8,
            global_batch=8, samples_per_s=1600.0)
time.sleep(600)
"""
FORGED = (117, 116, 116)
"""Lines each colluding job writes claiming 2-8 GPUs: 349 in all."""
MODEL = "model:Net:250:1000"


@pytest.fixture(scope="module")
def site(slurm_pool: Pool) -> Iterator[Site]:
    with site_beside(slurm_pool, 50) as s:
        yield s


def sbatch_forge(s: Site, user: str, name: str, res: str, role: str, forged: int) -> int:
    """A held job of ``user`` on one GPU whose script writes ``FORGE``'s lines."""
    job_dir = s.user_home(user) / name
    s.as_user(user, "mkdir", "-p", str(job_dir))
    r = s.as_user(
        user, "sbatch", "--parsable", "--hold", f"--reservation={res}", "--gres=gpu:1",
        "--output=/dev/null", f"--comment=hpcorch:id={name},min=1,max=1,batch=8,dir={job_dir}",
        "--wrap", f"{PYTHON} {s.root / 'forge.py'} {job_dir} {role} {forged}",
    )  # fmt: skip
    return int(r.stdout.strip().split(";")[0])


def keys(state: Path, across_owners: bool) -> dict[int, str]:
    """The pooling key of every job, as the controller's round builds it from its store."""
    store = Store(state / "state.db", readonly=True)
    try:
        views = [
            job_view(rec, store.samples(rec.slurm_id), {"n1": 0, "n2": 1}, 8)
            for rec in store.jobs()
            if rec.active
        ]
    finally:
        store.close()
    got, _ = model_keys(views, (), across_owners)
    return {int(k): v for k, v in got.items()}


def test_forged_shapes_never_reach_the_store_nor_another_owner_s_group(site: Site) -> None:
    res = "t-reports"
    reservation(site, res, f"{ALICE},{BOB},root")
    (site.root / "forge.py").write_text(FORGE)
    (site.root / "forge.py").chmod(0o644)
    state = site.root / "ctl-reports"
    ctl = ControllerProc(site_pool(site), state, res, *FAST)
    ctl.start()
    try:
        liars = [sbatch_forge(site, ALICE, f"a-{i}", res, "forge", n) for i, n in enumerate(FORGED)]
        bob = sbatch_forge(site, BOB, "b-0", res, "honest", 0)

        def stored() -> dict[int, list[tuple[int, int, float]]]:
            store = Store(state / "state.db", readonly=True)
            try:
                return {
                    j: [(s.gpus, s.nodes, s.step_time) for s in store.samples(j)]
                    for j in [*liars, bob]
                }
            finally:
                store.close()

        honest_shaped = [len(range(0, n, 10)) for n in FORGED]  # 12 each
        wait_for(
            "every job's lines read",
            lambda: all(
                len(got) >= want
                for got, want in zip(stored().values(), [*honest_shaped, 40], strict=True)
            ),
            120,
            ctl.log,
        )
        time.sleep(3)  # a few more cycles: nothing else comes
        got = stored()
        assert [len(v) for v in got.values()] == [*honest_shaped, 40]
        assert {(g, n) for v in got.values() for g, n, _ in v} == {(1, 1)}  # Slurm's shape
        assert {t for j in liars for _, _, t in got[j]} == {0.005}
        assert {t for _, _, t in got[bob]} == {0.5}
        said = [ln for ln in ctl.log.read_text().splitlines() if "another shape" in ln]
        assert len(said) == 3, said  # once per job, not once per line
        for j in liars:
            assert sum(f"job {j} reported steps on 2 GPUs; Slurm runs launch 1 on 1 GPU(s), "
                       "1 node(s)" in ln for ln in said) == 1  # fmt: skip
        # the pooling key, as the controller's round builds it: per owner
        by_owner = keys(state, across_owners=False)
        assert {by_owner[j] for j in liars} == {f"{ALICE}/{MODEL}"}
        assert by_owner[bob] == f"{BOB}/{MODEL}"
        # the site's opt-in: alice's jobs and bob's disagree 100x, and are not pooled
        across = keys(state, across_owners=True)
        assert across[bob] not in {across[j] for j in liars}
        # the controller runs with the opt-in (the policy wrapped) and plans as before
        ctl.stop()
        ctl = ControllerProc(site_pool(site), state, res, *FAST, "--pool-models-across-users")
        ctl.start()
        time.sleep(6)  # a few rounds
        assert ctl.proc is not None and ctl.proc.poll() is None
        assert "plan ignored" not in ctl.log.read_text()
        assert all(ctl.phase(j) == "running" for j in [*liars, bob])
    finally:
        ctl.stop()
        drop_reservation(site, res)
