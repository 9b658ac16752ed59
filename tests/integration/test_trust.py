"""A controller a site can trust, on a real pool with real second Unix users: no user path
steers where it writes, a hostile comment or metrics file cannot crash or confuse it, a
wrong reservation is refused, a spool it cannot write backs off with the GPUs released,
and the shipped systemd unit runs it as its own unprivileged user."""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from hpcorch.controller.store import JobRecord, Store
from hpcorch.planner import read_plan
from tests.conftest import REPO, Pool
from tests.integration.controller_util import FAST, ControllerProc, submit, wait_for
from tests.integration.users import (
    ALICE,
    BOB,
    CONTROLLER,
    PYTHON,
    Site,
    sbatch_as,
    site_beside,
)

pytestmark = pytest.mark.slurm

HUGE = "99999999999999999999999"
UNIT = REPO / "slurm" / "hpcorch-controller.service"


@pytest.fixture(scope="module")
def site(slurm_pool: Pool) -> Iterator[Site]:
    with site_beside(slurm_pool, 50) as s:
        yield s


def site_pool(s: Site) -> Pool:
    return Pool(s.pool_dir, s.env, 2, 4, s.root)


def find(state: Path, job: int) -> JobRecord | None:
    if not (state / "state.db").exists():
        return None
    store = Store(state / "state.db", readonly=True)
    try:
        return store.job(job)
    finally:
        store.close()


def record(state: Path, job: int) -> JobRecord:
    rec = find(state, job)
    assert rec is not None, f"job {job} not in {state}"
    return rec


def reservation(s: Site, name: str, users: str) -> None:
    r = s.slurm(
        "scontrol", "create", "reservation", f"ReservationName={name}", "Nodes=n1,n2",
        f"Users={users}", "StartTime=now", "Duration=infinite", "Flags=IGNORE_JOBS",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def drop_reservation(s: Site, name: str) -> None:
    s.slurm("scancel", f"--reservation={name}")
    for _ in range(40):
        if s.slurm("scontrol", "delete", "reservation", name).returncode == 0:
            return
        time.sleep(0.5)


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: its kind and, for a symbolic link, its target."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = f"-> {os.readlink(p)}" if p.is_symlink() else p.is_dir()
    return {k: str(v) for k, v in out.items()}


def test_no_user_path_steers_where_the_controller_writes(site: Site, tmp_path: Path) -> None:
    """As hpcorch-alice: a comment whose dir= holds symlinks named like the plan's files
    (to a file of root's), a dir= in a directory only root may enter, dir= the controller's
    own state directory, and a metrics file that is a symlink to a root-only file. The
    controller (root here, as in the report) starts every job; nothing outside its spool is
    written, and nothing is read through the link."""
    res = "t-attack"
    reservation(site, res, f"{ALICE},root")
    state = site.root / "ctl-attack"
    victim = site.root / "victim"
    victim.write_text("precious\n")
    root_only = site.root / "root-only"
    root_only.mkdir(mode=0o700)
    secret = site.root / "secret.jsonl"
    secret.write_text(
        '{"event": "steps", "step_time": 0.001, "samples_per_s": 424242.0, "step": 9}\n'
    )
    secret.chmod(0o600)
    home = site.user_home(ALICE)
    x, y = home / "x", home / "y"
    for d in (x, y):
        site.as_user(ALICE, "mkdir", str(d))
    for name in ("plan.json", "plan.json.tmp"):
        site.as_user(ALICE, "ln", "-s", str(victim), str(x / name))
    site.as_user(ALICE, "ln", "-s", str(secret), str(y / "metrics.jsonl"))
    before = {d: tree(d) for d in (x, y, root_only)}
    dirs = {"links": x, "root-only": root_only / "created", "state": state, "metrics": y}
    jobs = {
        name: sbatch_as(site, ALICE, f"hpcorch:id=a-{name},min=1,max=1,batch=8,dir={d}", res)
        for name, d in dirs.items()
    }
    ctl = ControllerProc(site_pool(site), state, res, *FAST)
    ctl.start()
    try:
        wait_for(
            "every job running",
            lambda: all(ctl.phase(j) == "running" for j in jobs.values()),
            90,
            ctl.log,
        )
        time.sleep(3)  # a few cycles of reading metrics
        assert victim.read_text() == "precious\n"
        assert not (root_only / "created").exists()
        assert {d: tree(d) for d in (x, y, root_only)} == before
        assert sorted(p.name for p in state.iterdir()) == [
            "controller.lock", "controller.log", "jobs", "query.sock", "state.db", "state.db-shm",
            "state.db-wal",
        ]  # fmt: skip
        for job in jobs.values():
            plan = state / "jobs" / str(job) / "plan.json"
            assert read_plan(plan).job == f"a-{next(k for k, v in jobs.items() if v == job)}"
            assert site.as_user(ALICE, "cat", str(plan), check=False).returncode == 0
            assert site.as_user(BOB, "cat", str(plan), check=False).returncode != 0
        rec = record(state, jobs["metrics"])
        assert rec.samples_per_s != 424242.0
        assert "symbolic link" in rec.reason
        assert ctl.proc is not None and ctl.proc.poll() is None
    finally:
        ctl.stop()
        drop_reservation(site, res)


def test_a_huge_batch_is_refused_and_the_controller_stays_up(
    env_pool: Pool, tmp_path: Path
) -> None:
    res = f"t-huge-{os.getpid()}"
    script = tmp_path / "ok.py"
    script.write_text("print('ok')\n")
    r = env_pool.hpcorch(
        "submit", "--pool", res, "--min-gpus", "1", "--batch-size", HUGE, str(script), check=False
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: Invalid value for '--batch-size'")
    ctl = ControllerProc(env_pool, tmp_path / "ctl", res, "--nodes", "n1", *FAST)
    ctl.start()
    try:
        bad = int(
            env_pool.run(
                "sbatch", "--parsable", "--hold", f"--reservation={res}", "--gres=gpu:1",
                "--output=/dev/null", f"--comment=hpcorch:id=huge,min=1,max=1,batch={HUGE}",
                "--wrap", "sleep 60",
            ).stdout.split(";")[0]
        )  # fmt: skip
        wait_for("the bad job refused", lambda: ctl.phase(bad) == "refused", 60, ctl.log)
        good = submit(env_pool, res, "good", 1, 1, "--epochs", "1")
        wait_for("the good job started", lambda: ctl.phase(good) == "running", 90, ctl.log)
        assert ctl.proc is not None and ctl.proc.poll() is None
        ctl.kill9()  # and after a restart, with the bad job still listed
        ctl.start()
        time.sleep(3)
        assert ctl.proc.poll() is None
        out = env_pool.hpcorch("status", "--state-dir", str(ctl.state)).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith(str(bad)))
        assert "REFUSED" in line and f"refused: batch={HUGE} is outside 1..2147483647" in line
        assert ctl.log.read_text().count(f"job {bad} ") == 1  # refused once, said once
        assert env_pool.state(bad) == "PENDING"
    finally:
        ctl.stop()
        env_pool.run("scancel", f"--reservation={res}", check=False)
        cleanup_reservation(env_pool, res)


def cleanup_reservation(pool: Pool, res: str) -> None:
    for _ in range(40):
        if pool.run("scontrol", "delete", "reservation", res, check=False).returncode == 0:
            return
        time.sleep(0.5)


def test_a_wrong_reservation_is_refused_and_nothing_is_lost(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-resv-{os.getpid()}"
    ctl = ControllerProc(env_pool, tmp_path / "ctl", res, "--nodes", "n1", *FAST)
    ctl.start()
    try:
        job = submit(env_pool, res, "keep", 1, 2, "--epochs", "1000")
        wait_for("the job running", lambda: ctl.phase(job) == "running", 90, ctl.log)
        ctl.stop()
        wrong = f"t-wrong-{os.getpid()}"
        r = env_pool.hpcorch(
            "controller", "--reservation", wrong, "--state-dir", str(ctl.state), "--once",
            check=False,
        )  # fmt: skip
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert r.stderr.strip() == (
            f"Error: the state in {ctl.state} belongs to reservation '{res}', not '{wrong}': "
            f"run with --reservation {res}, or add --adopt to take it over for '{wrong}' "
            f"(the jobs of '{res}' are then marked lost)"
        )
        assert wrong not in env_pool.run("scontrol", "show", "reservation").stdout
        assert ctl.phase(job) == "running" and env_pool.state(job) == "RUNNING"
        ctl.start()
        time.sleep(3)
        assert ctl.phase(job) == "running"
        starts = [d for d in ctl.decisions() if d.action == "start" and d.slurm_id == job]
        assert len(starts) == 1  # never started again: it was never lost
    finally:
        ctl.stop()
        env_pool.run("scancel", f"--reservation={res}", check=False)
        cleanup_reservation(env_pool, res)


def mount_small(where: Path) -> None:
    """A full 64 KiB tmpfs at ``where`` (needs mount rights: root on the test machines)."""
    where.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)])
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    fill_up(where)


def fill_up(where: Path) -> None:
    """Write ``where``/fill until its file system is full."""
    with open(where / "fill", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_spool_that_cannot_be_written_backs_off_with_the_gpus_released(
    env_pool: Pool, tmp_path: Path
) -> None:
    """Job A's directory in the spool full, then read-only: A's start fails with one clear
    reason, A is retried after 2, 4, 8, 16 s (not every cycle) and then failed with the
    reason, never released to Slurm without its plan; meanwhile its GPUs go to job B."""
    res = f"t-full-{os.getpid()}"
    made = env_pool.run(
        "scontrol", "create", "reservation", f"ReservationName={res}", "Nodes=n1", "Users=root",
        "StartTime=now", "Duration=infinite", "Flags=IGNORE_JOBS",
    )  # fmt: skip
    assert made.returncode == 0
    a = submit(env_pool, res, "A", 4, 4, "--epochs", "1")
    spool = Path(env_pool.env["HPCORCH_SPOOL"])
    full = spool / str(a)
    ctl = ControllerProc(env_pool, tmp_path / "ctl", res, *FAST)
    try:
        mount_small(full)
        ctl.start()
        wait_for(
            "A's start failing",
            lambda: "No space left on device" in getattr(find(ctl.state, a), "reason", ""),
            60,
            ctl.log,
        )
        rec = record(ctl.state, a)
        assert rec.phase == "queued" and "GPUs released, retry 1/4 in 2 s" in rec.reason
        assert rec.reason.startswith(f"start failed (cannot write the plan to {full}/plan.json")
        subprocess.run(["mount", "-o", "remount,ro", str(full)], check=True)
        b = submit(env_pool, res, "B", 4, 4, "--epochs", "1000")
        wait_for("B started on the GPUs A released", lambda: ctl.phase(b) == "running", 90)
        env_pool.run("scancel", str(b))
        wait_for("A failed", lambda: ctl.phase(a) == "failed", 120, ctl.log)
        rec = record(ctl.state, a)
        assert rec.reason.startswith("start failed 5 times, gave up: cannot write the plan")
        assert rec.reason.endswith("Read-only file system")
        starts = [d for d in ctl.decisions() if d.slurm_id == a and d.action == "start"]
        assert len(starts) == 5, starts
        gaps = [n.time - p.time for p, n in itertools.pairwise(starts)]
        assert all(g >= w - 0.5 for g, w in zip(gaps, (2, 4, 8, 16), strict=True)), gaps
        assert len([ln for ln in ctl.log.read_text().splitlines() if f"job {a}" in ln]) <= 12
        assert env_pool.state(a) == "PENDING"  # never released to Slurm without its plan
    finally:
        ctl.stop()
        subprocess.run(["umount", "-l", str(full)])
        env_pool.run("scancel", f"--reservation={res}", check=False)
        cleanup_reservation(env_pool, res)


# --- the shipped systemd unit -----------------------------------------------------------


def unit_service(path: Path) -> dict[str, list[str]]:
    """The [Service] settings of a unit file (every value of a repeated key)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def run_unit(
    s: Site, var_lib: Path, log: Path, *extra: str, writable: Sequence[Path] = ()
) -> subprocess.Popen[str]:
    """The controller as the unit runs it: its user and group, umask, environment and
    command, with ProtectSystem=strict as systemd makes it (a private mount namespace in
    which everything is read-only but ReadWritePaths); /var/lib/hpcorch is ``var_lib``.
    ``writable``: more ReadWritePaths, as a site adds for a spool its hosts share."""
    installed = s.prefix / "share" / "hpcorch"  # the unit as slurm/install-site put it
    unit = unit_service(installed / "systemd" / UNIT.name)
    (user,), (group,) = unit["User"], unit["Group"]
    assert (user, group) == (CONTROLLER, CONTROLLER)
    assert unit["ProtectSystem"] == ["strict"] and unit["NoNewPrivileges"] == ["yes"]

    def local(value: str) -> str:
        return value.replace("/var/lib/hpcorch", str(var_lib))

    # StateDirectory=hpcorch, StateDirectoryMode: systemd creates it for the user
    var_lib.mkdir(mode=int(unit["StateDirectoryMode"][0], 8))
    os.chown(var_lib, s.uids[CONTROLLER], s.uids[CONTROLLER])
    var_lib.chmod(int(unit["StateDirectoryMode"][0], 8))
    env = {**s.env, "HOME": "/nonexistent"}
    for assignment in unit["Environment"]:
        key, _, value = assignment.partition("=")
        env[key] = local(value) if key != "SLURM_CONF" else s.env["SLURM_CONF"]
    argv = shlex.split(unit["ExecStart"][0])
    assert argv[0] == str(s.prefix / "bin" / "hpcorch"), argv  # the installed command
    # --config /etc/hpcorch/controller.toml: the example file as an admin installs it
    conf = var_lib.parent / "controller.toml"
    conf.write_text(local((installed / "examples" / "controller.toml").read_text()))
    conf.chmod(0o644)
    argv = [str(conf) if a == "/etc/hpcorch/controller.toml" else a for a in argv]
    argv = [*argv, *extra]
    rw = [local(p) for v in unit["ReadWritePaths"] for p in v.split()]
    rw += [str(p) for p in writable]
    binds = " && ".join(f"mount --bind {shlex.quote(p)} {shlex.quote(p)}" for p in rw)
    umask = unit["UMask"][0]
    setpriv = ["setpriv", "--reuid", user, "--regid", group, "--init-groups", "--no-new-privs"]
    inner = f"umask {umask} && exec {shlex.join([*setpriv, *argv])}"
    script = f"{binds} && mount -o remount,bind,ro / && {inner}"
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
        text=True,
        cwd="/",
    )


def stop_unit(proc: subprocess.Popen[str], s: Site, reservation: str = "hpcorch") -> None:
    """Stop the controller run_unit started (SIGTERM; killed after 30 s) and drop its
    reservation."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    drop_reservation(s, reservation)


JOB_SH = """#!/bin/bash
# rank 0 copies the plan it was given and reports one step
[[ ${RANK:-0} == 0 ]] || exit 0
cat "$HPCORCH_PLAN" >"$HPCORCH_JOB_DIR/plan-seen.json" || exit 3
# the GPUs it runs on (Slurm's count wins: a line naming another is dropped)
steps='{"event": "steps", "step_time": 0.5, "step": 3, "samples_per_s": 64.0,'
steps+=' "gpus": '"${WORLD_SIZE:-1}"', "global_batch": 32, "per_gpu_batch": 32, "accum_steps": 1}'
printf '%s\\n' '{"event": "start", "epochs": 1}' "$steps" >>"$HPCORCH_JOB_DIR/metrics.jsonl"
sleep 5
"""


def test_the_systemd_unit_runs_the_controller_as_its_own_user(site: Site) -> None:
    """hpcorch-controller.service as written (user hpcorch, UMask, ProtectSystem=strict
    with ReadWritePaths=/var/lib/hpcorch), the pool's SlurmUser hpcorch being its operator
    rights; hpcorch-alice and hpcorch-bob submit with `hpcorch submit`. Each job reads the
    plan the controller wrote for it (and not the other's), the controller reads their
    metrics, and both finish."""
    reservation(site, "hpcorch", f"{ALICE},{BOB}")
    var_lib = site.root / "var-lib-hpcorch"
    log = site.root / "unit.log"
    proc = run_unit(site, var_lib, log, "--nodes", "n1,n2", *FAST)
    try:
        wait_for("the controller up", lambda: "adopted reservation" in log.read_text(), 60, log)
        assert proc.poll() is None, log.read_text()
        uid_line = next(
            ln for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            if ln.startswith("Uid:")
        )  # fmt: skip
        assert uid_line.split()[1:] == [str(site.uids[CONTROLLER])] * 4
        jobs = {}
        for user in (ALICE, BOB):
            script = site.user_home(user) / "job.sh"
            script.write_text(JOB_SH)
            os.chown(script, site.uids[user], site.uids[CONTROLLER])
            script.chmod(0o755)
            env = site.user_env(
                user,
                HPCORCH_SPOOL=str(var_lib / "jobs"),
                HPCORCH_CONTROLLER_DIR=str(var_lib),
            )
            out = site.as_user(
                user, PYTHON, "-m", "hpcorch", "submit", "--pool", "hpcorch",
                "--mode", "managed", "--min-gpus", "1", "--max-gpus", "2", "--batch-size", "32",
                "--parsable", str(script), env=env,
            )  # fmt: skip
            jobs[user] = int(out.stdout.strip())
        pool = site_pool(site)
        for user, job in jobs.items():
            wait_for(f"{user}'s job done", lambda j=job: _phase(var_lib, j) == "done", 120, log)  # type: ignore[misc]
        for user, job in jobs.items():
            other = jobs[BOB if user == ALICE else ALICE]
            plan = var_lib / "jobs" / str(job) / "plan.json"
            job_dir = next(site.user_home(user).glob("jobs/*"))
            seen, mine = read_plan(job_dir / "plan-seen.json"), read_plan(plan)
            # its own plan (a later rebatch may have rewritten the batch since it read it)
            assert (seen.job, seen.launch, seen.gpus) == (mine.job, mine.launch, mine.gpus)
            assert site.as_user(user, "cat", str(plan), check=False).returncode == 0
            spied = var_lib / "jobs" / str(other) / "plan.json"
            assert site.as_user(user, "cat", str(spied), check=False).returncode != 0
            rec = record(var_lib, job)
            assert rec.samples_per_s == 64.0 and rec.user == user
            assert pool.state(job) == "COMPLETED"
        for p in var_lib.rglob("*"):
            assert p.stat().st_uid == site.uids[CONTROLLER], p
        assert "Read-only file system" not in log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        stop_unit(proc, site)


def _phase(state: Path, job: int) -> str:
    return str(getattr(find(state, job), "phase", "?"))
