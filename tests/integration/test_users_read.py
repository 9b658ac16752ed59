"""Users read the pool. The controller runs as the shipped unit runs it (user ``hpcorch``,
state.db 0640 in /var/lib/hpcorch); hpcorch-alice and hpcorch-bob each run a job. As
alice, with the environment the admin guide gives, ``status``, ``describe``, ``report``,
``metrics`` and ``logs`` answer: her own job in full, bob's as squeue shows it (no
directory, no metrics, no reason text of the controller's), his output and metrics refused
with one line. Bad clients of the query socket (garbage, a huge request, clients that
connect and never write, a flood) stop neither the controller's cycles nor other readers."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcorch.controller.store import Store
from tests.conftest import Pool
from tests.integration.controller_util import FAST, wait_for
from tests.integration.test_trust import reservation, run_unit, stop_unit
from tests.integration.users import (
    ALICE,
    BOB,
    PYTHON,
    Site,
    site_beside,
)

pytestmark = pytest.mark.slurm

SOCKET = "query.sock"

JOB_SH = """#!/bin/bash
# rank 0 says hello, reports one step (with a loss) and keeps running
[[ ${RANK:-0} == 0 ]] || exit 0
echo "hello from $(id -un)"
steps='{"event": "steps", "step_time": 0.5, "step": 3, "samples_per_s": 64.0, "gpus": 1,'
steps+=' "global_batch": 32, "per_gpu_batch": 32, "accum_steps": 1, "loss": 1.5}'
printf '%s\\n' '{"event": "start", "epochs": 1}' "$steps" >>"$HPCORCH_JOB_DIR/metrics.jsonl"
sleep 600
"""


@pytest.fixture(scope="module")
def site(slurm_pool: Pool) -> Iterator[Site]:
    with site_beside(slurm_pool, 50) as s:
        yield s


@dataclass
class Running:
    site: Site
    var_lib: Path
    log: Path
    proc: subprocess.Popen[str]
    jobs: dict[str, int]

    def env(self, user: str) -> dict[str, str]:
        """The user's environment as the admin guide sets it (/etc/profile.d/hpcorch.sh)."""
        return self.site.user_env(
            user,
            HPCORCH_SPOOL=str(self.var_lib / "jobs"),
            HPCORCH_CONTROLLER_DIR=str(self.var_lib),
        )

    def hpcorch(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.site.as_user(
            user, PYTHON, "-m", "hpcorch", *args, env=self.env(user), check=False, timeout=120
        )

    def record(self, job: int) -> object:
        store = Store(self.var_lib / "state.db", readonly=True)
        try:
            return store.job(job)
        finally:
            store.close()

    def cycles(self) -> list[tuple[float, float]]:
        """(time, seconds) of every cycle the controller ran, oldest first."""
        store = Store(self.var_lib / "state.db", readonly=True)
        try:
            return [(c["time"], c["seconds"]) for c in reversed(store.recent_cycles(10000))]
        finally:
            store.close()


@pytest.fixture(scope="module")
def running(site: Site) -> Iterator[Running]:
    """The unit's controller, and one running job of alice's and one of bob's."""
    reservation(site, "hpcorch", f"{ALICE},{BOB}")
    var_lib = site.root / "var-lib-hpcorch"
    log = site.root / "unit.log"
    proc = run_unit(site, var_lib, log, "--nodes", "n1,n2", *FAST)
    r = Running(site, var_lib, log, proc, {})
    try:
        wait_for("the controller up", lambda: "adopted reservation" in log.read_text(), 60, log)
        for user in (ALICE, BOB):
            script = site.user_home(user) / "job.sh"
            script.write_text(JOB_SH)
            os.chown(script, site.uids[user], site.uids["hpcorch"])
            script.chmod(0o755)
            out = site.as_user(
                user, PYTHON, "-m", "hpcorch", "submit", "--pool", "hpcorch", "--name",
                f"{user[8:]}-job", "--mode", "managed", "--min-gpus", "1", "--max-gpus", "1",
                "--batch-size", "32", "--parsable", str(script), env=r.env(user),
            )  # fmt: skip
            r.jobs[user] = int(out.stdout.strip())
        for job in r.jobs.values():
            wait_for(
                f"job {job} running with its report",
                lambda j=job: getattr(r.record(j), "samples_per_s", 0) == 64.0,  # type: ignore[misc]
                120,
                log,
            )
        yield r
    finally:
        stop_unit(proc, site)


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    """The one error line a refused command prints (exit 1, no traceback)."""
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout, res.stderr)
    return res.stdout


def test_the_state_stays_private(running: Running) -> None:
    db = running.var_lib / "state.db"
    assert db.stat().st_mode & 0o777 == 0o640
    cat = running.site.as_user(ALICE, "cat", str(db), check=False)
    assert cat.returncode != 0 and "Permission denied" in cat.stderr


def test_a_user_reads_her_jobs_in_full_and_others_as_squeue_shows_them(
    running: Running,
) -> None:
    a, b = running.jobs[ALICE], running.jobs[BOB]
    bob_home = str(running.site.user_home(BOB))
    seen = []

    # status: both jobs with their phase; only hers with the controller's figures
    out = ok(running.hpcorch(ALICE, "status"))
    seen.append(out)
    rows = {int(ln.split()[0]): ln for ln in out.splitlines() if ln[:1].isdigit()}
    assert "RUNNING" in rows[a].split()[5:6] and "64" in rows[a].split(), out
    assert "RUNNING" in rows[b].split()[5:6] and "64" not in rows[b].split(), out
    assert "USAGE by user" in out and ALICE in out.split("USAGE")[1], out
    doc = json.loads(ok(running.hpcorch(ALICE, "status", "--json")))
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert (jobs[a]["phase"], jobs[a]["samples_per_s"], jobs[a]["user"]) == (
        "running", 64.0, ALICE,
    )  # fmt: skip
    assert (jobs[b]["phase"], jobs[b]["samples_per_s"], jobs[b]["user"]) == ("running", 0.0, BOB)
    assert {u["user"] for u in doc["usage"]} == {ALICE, BOB}

    # describe: hers in full, bob's reduced
    mine = ok(running.hpcorch(ALICE, "describe", str(a)))
    seen.append(mine)
    assert mine.startswith(f"job {a} (alice-job) of {ALICE}: running"), mine
    her_dir = str(running.site.user_home(ALICE) / "jobs")
    assert f"directory {her_dir}/" in mine and "\ndecisions\n" in mine, mine
    assert "throughput by GPU count" in mine and "64.0" in mine, mine
    his = ok(running.hpcorch(ALICE, "describe", str(b)))
    seen.append(his)
    assert his.startswith(f"job {b} (bob-job) of {BOB}: running"), his
    assert "GPUs 1 (range 1-1)" in his and "\n  directory" not in his and "TIME" not in his
    assert f"visible to {BOB} and the admins only" in his, his
    full = ok(running.hpcorch(BOB, "describe", str(b)))
    assert f"directory {bob_home}/jobs/" in full and "throughput by GPU count" in full, full

    # report: every job (the pool's utilisation needs them all); bob's without his losses
    rep = ok(running.hpcorch(ALICE, "report"))
    seen.append(rep)
    ids = [int(ln.split()[0]) for ln in rep.splitlines() if ln[:1].isdigit()]
    assert ids == sorted([a, b]), rep
    rows = {int(ln.split()[0]): ln.split() for ln in rep.splitlines() if ln[:1].isdigit()}
    assert rows[a][-1] == "1.5000" and rows[b][-1] == "-", rep
    doc = json.loads(ok(running.hpcorch(ALICE, "report", "--json")))
    by_id = {j["job_id"]: j for j in doc["jobs"]}
    assert by_id[a]["batches"] == [32] and by_id[a]["final_loss"] == 1.5
    assert by_id[b]["batches"] == [] and by_id[b]["final_loss"] is None
    admin = json.loads(
        running.site.as_user("root", PYTHON, "-m", "hpcorch", "report", "--json",
                             env=running.env(ALICE)).stdout
    )  # fmt: skip
    his_full = next(j for j in admin["jobs"] if j["job_id"] == b)
    assert by_id[b]["segments"] == his_full["segments"]  # his GPUs over time: squeue's too
    assert doc["utilisation"] == admin["utilisation"]

    # metrics: the pool's, and per job only hers
    met = ok(running.hpcorch(ALICE, "metrics"))
    seen.append(met)
    assert "hpcorch_pool_gpus{state=" in met
    assert f'hpcorch_job_samples_per_second{{name="alice-job",slurm_job_id="{a}"' in met, met
    assert f'slurm_job_id="{b}"' not in met, met
    met = ok(running.hpcorch(ALICE, "metrics", str(a)))
    assert f'hpcorch_job_gpus{{name="alice-job",slurm_job_id="{a}"' in met, met
    refused = one_line(running.hpcorch(ALICE, "metrics", str(b)))
    assert BOB in refused and bob_home not in refused, refused

    # logs: her own output; bob's refused
    assert "hello from hpcorch-alice" in ok(running.hpcorch(ALICE, "logs", str(a)))
    line = one_line(running.hpcorch(ALICE, "logs", str(b)))
    assert BOB in line and bob_home not in line, line
    assert line == f"Error: cannot read the output of job {b}: it is {BOB}'s (permission denied)"

    for text in seen:
        assert bob_home not in text and "hello from hpcorch-bob" not in text
    print(f"\n$ hpcorch status  # as {ALICE}\n{out}\n$ hpcorch describe {b}\n{his}")
    print(f"$ hpcorch metrics {b}\n{refused}\n$ hpcorch logs {b}\n{line}")
    print(f"$ hpcorch report\n{rep}")


def test_a_user_is_told_what_to_do_when_the_controller_does_not_answer(
    running: Running, tmp_path: Path
) -> None:
    """State unreadable and no socket there (a copy of the state, no controller): one line."""
    stale = running.site.root / "stale-state"
    stale.mkdir(mode=0o711)
    (stale / "state.db").write_bytes((running.var_lib / "state.db").read_bytes())
    (stale / "state.db").chmod(0o640)
    env = {**running.env(ALICE), "HPCORCH_CONTROLLER_DIR": str(stale)}
    for args in (["status"], ["describe", str(running.jobs[ALICE])], ["report"], ["metrics"]):
        res = running.site.as_user(ALICE, PYTHON, "-m", "hpcorch", *args, env=env, check=False)
        line = one_line(res)
        assert str(stale / "state.db") in line and "controller" in line, (args, line)
        print(f"\n$ hpcorch {' '.join(args)}  # no controller\n{line}")


def _ask(path: Path, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` (then end the request), return all of the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it stopped reading: the reply says why
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def test_bad_clients_stop_neither_the_controller_nor_other_readers(running: Running) -> None:
    sock = running.var_lib / SOCKET
    assert sock.is_socket() and sock.stat().st_uid == running.site.uids["hpcorch"]
    before = [s for _, s in running.cycles()[-30:]]
    t0 = time.time()

    reply = json.loads(_ask(sock, b"\x00\xffgarbage\n"))
    assert reply["ok"] is False and "\n" not in reply["error"], reply
    reply = json.loads(_ask(sock, b'{"q": "status", "pad": "' + b"x" * (1 << 20) + b'"}\n'))
    assert reply["ok"] is False and "4096 bytes" in reply["error"], reply

    # 100 clients that connect and never write
    silent = []
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(str(sock))
        silent.append(s)
    # a flood of good requests, as fast as one client can ask
    answered = refused = 0
    stop = threading.Event()

    def flood() -> None:
        nonlocal answered, refused
        while not stop.is_set():
            r = json.loads(_ask(sock, b'{"v": 1, "q": "status"}\n') or b'{"ok": false}')
            if r.get("ok"):
                answered += 1
            else:
                refused += 1

    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        started = time.monotonic()
        out = ok(running.hpcorch(ALICE, "status"))  # another user is served meanwhile
        took = time.monotonic() - started
        assert str(running.jobs[ALICE]) in out
        time.sleep(10)
    finally:
        stop.set()
        flooder.join(30)
    closed = 0
    for s in silent:
        try:
            data = s.recv(4096)
            closed += 1 if data == b"" or json.loads(data)["ok"] is False else 0
        except (TimeoutError, ConnectionResetError):
            pass
        s.close()
    assert closed == 100  # each dropped after the read timeout, or refused at once

    during = [s for t, s in running.cycles() if t >= t0]
    assert running.proc.poll() is None and "Traceback" not in running.log.read_text()
    assert len(during) >= 8, during  # the loop kept cycling (FAST: every second)
    print(
        f"\nstatus as alice under attack: {took:.2f} s; flood: {answered} answered, "
        f"{refused} refused; cycle median {statistics.median(before):.3f} s before, "
        f"{statistics.median(during):.3f} s during ({len(during)} cycles)"
    )
    assert statistics.median(during) < max(1.0, 3 * statistics.median(before))
