"""The accounting pool as a site with limits: hpcorch-alice (account ml) and hpcorch-bob
(accounts physics and ml) with associations of their own, hpcorch as the site installs
it for them (tests/integration/users.py ``install_site``), a spool they can read, and a
managed elastic job without torch (a shell script that speaks the runtime's protocol), so
that a case costs seconds of start-up, not a torch import per rank.

``PendingWatch`` polls squeue and keeps, for every job, how long Slurm showed it pending
for each reason: a launch Slurm keeps pending for a limit must not stay so for more than
one controller cycle."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.slurm.parse import SlurmJob
from tests.conftest import Pool
from tests.integration.users import (
    ALICE,
    BOB,
    PYTHON,
    ensure_user,
    install_site,
    module_env,
    world_dir,
)

CLUSTER = "hpcorch"

JOB_SH = r"""#!/bin/bash
# A managed elastic job without torch: WORK seconds of "training" in all, across launches.
# Every rank stops on the checkpoint signal (exit 75: relaunch me); rank 0 keeps the
# progress in the job directory and reports a start and steps as the runtime does.
work=${1:-10}
dir=$HPCORCH_JOB_DIR
trap 'exit 75' USR2
if [[ ${RANK:-0} != 0 ]]; then
  while [[ ! -f $dir/finished ]]; do sleep 0.5; done
  exit 0
fi
done_s=$(cat "$dir/progress" 2>/dev/null || echo 0)
printf '{"event": "start", "epochs": 1, "time": %s}\n' "$(date +%s.%N)" >>"$dir/metrics.jsonl"
while ((done_s < work)); do
  sleep 1
  done_s=$((done_s + 1))
  echo "$done_s" >"$dir/progress.tmp" && mv "$dir/progress.tmp" "$dir/progress"
  n=${WORLD_SIZE:-1}
  line='{"event": "steps", "step_time": 0.5, "step": %d, "steps": 2, "samples_per_s": %d,'
  line+=' "gpus": %d, "global_batch": 64, "per_gpu_batch": %d, "accum_steps": 1, "epoch": 0,'
  line+=' "time": %s}\n'
  # shellcheck disable=SC2059
  printf "$line" "$((done_s * 2))" "$((128 * n))" "$n" "$((64 / n))" "$(date +%s.%N)" \
    >>"$dir/metrics.jsonl"
done
touch "$dir/finished"
exit 0
"""

LIMIT_REASON = re.compile(r"^(QOS|Assoc|Partition).*|.*Limit.*|^MaxGRES.*|^MaxCpu.*|^MaxMem.*")
"""Slurm's pending reasons that name a limit (squeue(1), JOB REASON CODES)."""


def sacctmgr(pool: Pool, *args: str) -> None:
    """sacctmgr -i ARGS (exit 1 with "Nothing new added", or "Request didn't affect
    anything" on 25.11, where it is there already: a pool kept from an earlier session)."""
    res = pool.run("sacctmgr", "-i", *args, check=False)
    there = ("Nothing new added", "Request didn't affect anything")
    if res.returncode != 0 and not any(t in res.stdout + res.stderr for t in there):
        raise AssertionError(f"sacctmgr {' '.join(args)}: {res.stderr.strip() or res.stdout}")


@dataclass
class LimitSite:
    pool: Pool
    root: Path
    site: Path
    spool: Path
    job: Path
    reservation: str

    def user_env(self, user: str) -> dict[str, str]:
        home = self.root / "home" / user
        return {
            "PATH": self.pool.env["PATH"],
            "LANG": "C.UTF-8",
            "SLURM_CONF": self.pool.env["SLURM_CONF"],
            "LD_LIBRARY_PATH": self.pool.env.get("LD_LIBRARY_PATH", ""),
            "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": str(home),
            "HPCORCH_HOME": str(home),
            "HPCORCH_SPOOL": str(self.spool),
            "HPCORCH_PYTHON": PYTHON,
            "HPCORCH_WRAPPER": module_env(self.site)["HPCORCH_WRAPPER"],
            "HPCORCH_SLURM_BACKEND": "cli",
        }

    def as_user(
        self, user: str, *argv: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["setpriv", "--reuid", user, "--regid", user, "--init-groups", *argv]
        res = subprocess.run(
            cmd, env=self.user_env(user), text=True, capture_output=True, cwd=self.root
        )
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv[:5])} as {user}: {res.stderr.strip()[-2000:]}")
        return res

    def hpcorch(
        self, user: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.as_user(user, PYTHON, "-m", "hpcorch", *args, check=check)

    def submit(
        self, user: str, lo: int, hi: int, *opts: str, work: int = 8, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``hpcorch submit`` of the elastic shell job into the pool, as ``user``."""
        return self.hpcorch(
            user, "submit", "--pool", self.reservation, "--mode", "managed",
            "--min-gpus", str(lo), "--max-gpus", str(hi), "--batch-size", "64",
            "--max-per-gpu-batch", "64", "--parsable", *opts, str(self.job), str(work),
            check=check,
        )  # fmt: skip

    def submit_id(self, user: str, lo: int, hi: int, *opts: str, work: int = 8) -> int:
        return int(self.submit(user, lo, hi, *opts, work=work).stdout.strip().split(";")[0])

    def outside(self, user: str, gpus: int, *opts: str, nodes: str = "gpu-a004") -> int:
        """A plain job of ``user`` outside the pool (not in its reservation), running."""
        out = self.as_user(
            user, "sbatch", "--parsable", f"--gres=gpu:{gpus}", f"--nodelist={nodes}",
            "--output=/dev/null", "--time=30", *opts, "--wrap", "sleep 600",
        )  # fmt: skip
        job = int(out.stdout.strip().split(";")[0])
        self.pool.wait_state(job, {"RUNNING"}, 60)
        return job


def make_limit_site(pool: Pool, reservation: str, nodes: str) -> LimitSite:
    """Users with associations (alice: ml; bob: physics by default, and ml), their copy of
    hpcorch, a spool and the job script, and ``reservation`` on ``nodes`` for them."""
    for user in (ALICE, BOB):
        ensure_user(user)
    sacctmgr(pool, "add", "user", ALICE, "account=ml", f"cluster={CLUSTER}")
    sacctmgr(pool, "add", "user", BOB, "account=physics,ml", "defaultaccount=physics")
    for user in (ALICE, BOB):
        sacctmgr(pool, "modify", "user", user, "set", "qos=normal,high", "defaultqos=normal")
    root = world_dir("hpcorch-limits-")
    site = install_site()
    spool = root / "spool"
    spool.mkdir(mode=0o711)
    job = root / "elastic.sh"
    job.write_text(JOB_SH)
    job.chmod(0o755)
    for user in (ALICE, BOB):
        home = root / "home" / user
        home.mkdir(parents=True)
        subprocess.run(["chown", user, str(home)], check=True)
    (root / "home").chmod(0o711)
    # a run killed before its teardown left its reservation (the pool keeps its state)
    prefix = reservation.rsplit("-", 1)[0] + "-"
    shown = pool.run("scontrol", "-o", "show", "reservation", check=False).stdout
    for old in re.findall(r"ReservationName=(\S+)", shown):
        if old.startswith(prefix):
            pool.run("scancel", f"--reservation={old}", check=False)
            time.sleep(1)
            pool.run("scontrol", "delete", f"reservation={old}", check=False)
    pool.run(
        "scontrol", "create", "reservation", f"ReservationName={reservation}",
        f"Nodes={nodes}", f"Users=root,{ALICE},{BOB}", "StartTime=now",
        "Duration=1-00:00:00", "Flags=IGNORE_JOBS",
    )  # fmt: skip
    return LimitSite(pool, root, site, spool, job, reservation)


def drop_limit_site(s: LimitSite) -> None:
    env = s.pool.env
    for user in (ALICE, BOB):
        subprocess.run(["scancel", "-u", user], env=env, capture_output=True)
    time.sleep(1)
    subprocess.run(
        ["scontrol", "delete", f"reservation={s.reservation}"], env=env, capture_output=True
    )
    subprocess.run(["rm", "-rf", str(s.root)], check=False)


@dataclass
class PendingWatch:
    """Polls squeue every ``every`` seconds: for each job and pending reason, every
    stretch of polls in a row that saw the job pending so (``episodes``: first and last
    time seen), and each poll's running jobs (``running``)."""

    pool: Pool
    every: float = 0.3
    episodes: dict[tuple[int, str], list[list[float]]] = field(default_factory=dict)
    running: list[list[SlurmJob]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PendingWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        before: set[tuple[int, str]] = set()
        while not self._stop.is_set():
            try:
                jobs = self.pool.squeue()
            except (AssertionError, ValueError):  # slurmctld busy: the next poll
                self._stop.wait(self.every)
                continue
            now = time.time()
            seen: set[tuple[int, str]] = set()
            for j in jobs.values():
                if j.state != "PENDING" or j.held:
                    continue
                key = (j.job_id, j.reason)
                seen.add(key)
                runs = self.episodes.setdefault(key, [])
                if key in before and runs:
                    runs[-1][1] = now
                else:
                    runs.append([now, now])
            before = seen
            self.running.append([j for j in jobs.values() if j.state == "RUNNING"])
            self._stop.wait(self.every)

    def limit_waits(self, jobs: set[int] | None = None) -> dict[tuple[int, str], float]:
        """The longest time each job was seen pending in a row for a reason that names a
        limit, by (job, reason)."""
        return {
            k: max(b - a for a, b in runs)
            for k, runs in self.episodes.items()
            if LIMIT_REASON.match(k[1]) and (jobs is None or k[0] in jobs)
        }

    def peak(self, jobs: set[int], key: Any = None) -> dict[Any, tuple[int, int]]:
        """The most (GPUs, running jobs) of ``jobs`` seen at once, by ``key(job)`` (one
        group when None)."""
        out: dict[Any, tuple[int, int]] = {}
        for poll in self.running:
            now: dict[Any, list[int]] = {}
            for j in poll:
                if j.job_id in jobs:
                    k = key(j) if key else None
                    have = now.setdefault(k, [0, 0])
                    have[0] += gpus_of(j)
                    have[1] += 1
            for k, (g, n) in now.items():
                was = out.get(k, (0, 0))
                out[k] = (max(was[0], g), max(was[1], n))
        return out


def gpus_of(j: SlurmJob) -> int:
    return sum(j.gpus_by_node) if j.gpus_by_node else j.gpus_per_node * j.node_count
