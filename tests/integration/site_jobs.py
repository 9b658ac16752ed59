"""Jobs of real second Unix users on a site pool (tests/integration/users.py), and the
controller as the shipped systemd unit runs it, "on a host" of its own: what the tests of
the pool's contract, drains and maintenance windows share.

The jobs are shell scripts that speak the runtime's protocol (a start report, steps lines,
checkpoints, exit codes), each keeping or breaking the contract as its first argument says:
the users' interpreter has no torch."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpcorch.controller.store import JobRecord, Store
from tests.conftest import Pool
from tests.integration.controller_util import wait_for
from tests.integration.test_trust import drop_reservation, run_unit, stop_unit
from tests.integration.users import ALICE, BOB, CONTROLLER, PYTHON, Site

QUICK = ("--interval", "1", "--round", "2", "--min-run", "2", "--restart-cost", "2",
         "--policy", "share")  # fmt: skip
"""The controller's settings for these tests (the share policy: every job its share)."""

JOB_SH = """#!/bin/bash
# A pool job that speaks the runtime's protocol from the shell, and keeps or breaks the
# contract as its first argument says. Rank 0 reports; the other ranks only wait.
if [[ ${RANK:-0} != 0 ]]; then
  if [[ $1 == stubborn ]]; then trap '' USR2; else trap 'exit 75' USR2; fi
  sleep 3600 & wait $!
  exit 0
fi
out=$HPCORCH_JOB_DIR/metrics.jsonl
say() { printf '%s\\n' "$1" >>"$out"; }
start() { say '{"event": "start", "epochs": 1, "step": 0}'; }
checkpoint() { say '{"event": "checkpoint", "step": '"$1"'}'; }
steps() {
  local f='"step_time": 0.5, "samples_per_s": 64.0, "global_batch": 32'
  f+=', "per_gpu_batch": 32, "accum_steps": 1'
  say '{"event": "steps", "step": '"$1"', "gpus": '"${WORLD_SIZE:-1}"', '"$f"'}'
}
case $1 in
  good)  # trains; checkpoints when asked and asks to be relaunched; resumes where it was
    ck=$HPCORCH_JOB_DIR/step
    i=$(cat "$ck" 2>/dev/null || echo 0)
    trap 'echo "$i" >"$ck"; checkpoint "$i"; exit 75' USR2
    say '{"event": "start", "epochs": 1, "step": '"$i"'}'
    while :; do i=$((i + 1)); steps "$i"; sleep 1 & wait $!; done ;;
  stubborn)  # trains, never checkpoints: ignores the controller's signal
    trap '' USR2
    start
    for i in $(seq 1 3600); do steps "$i"; sleep 1; done ;;
  silent)  # never says it started
    sleep 3600 ;;
  nockpt)  # trains, then cannot write its checkpoint (the runtime's exit 74)
    start
    steps 50
    sleep 2
    exit 74 ;;
  short)  # trains a little and finishes
    start
    steps 10
    sleep "${2:-3}" ;;
esac
"""


def make_reservation(s: Site, name: str) -> None:
    drop_reservation(s, name)
    r = s.slurm(
        "scontrol", "create", "reservation", f"ReservationName={name}", "Nodes=n1,n2",
        f"Users={ALICE},{BOB},{CONTROLLER}", "StartTime=now", "Duration=infinite",
        "Flags=IGNORE_JOBS",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


class Host:
    """A controller as the unit runs it, as if on its own login node: its own state
    directory; the spool every host shares (``shared``)."""

    def __init__(self, s: Site, name: str, reservation: str, shared: Path, *args: str) -> None:
        self.s, self.reservation = s, reservation
        self.root = s.root / name
        self.root.mkdir(exist_ok=True)
        self.var_lib = self.root / "var-lib"
        self.log = self.root / "controller.log"
        self.spool = shared
        self.args = ("--reservation", reservation, "--spool", str(shared), *QUICK, *args)
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = run_unit(self.s, self.var_lib, self.log, *self.args, writable=[self.spool])
        wait_for("the controller up", lambda: "reservation" in self.text(), 60, self.log)

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def pid(self) -> int:
        """The controller's process: the unit's unshare, sh and setpriv each exec the next."""
        assert self.proc is not None
        return self.proc.pid

    def record(self, job: int) -> JobRecord | None:
        if not (self.var_lib / "state.db").exists():
            return None
        store = Store(self.var_lib / "state.db", readonly=True)
        try:
            return store.job(job)
        finally:
            store.close()

    def phase(self, job: int) -> str:
        return str(getattr(self.record(job), "phase", "?"))

    def reason(self, job: int) -> str:
        return str(getattr(self.record(job), "reason", ""))

    def decisions(self, job: int) -> list[str]:
        if not (self.var_lib / "state.db").exists():
            return []
        store = Store(self.var_lib / "state.db", readonly=True)
        try:
            return [d.action for d in store.decisions() if d.slurm_id == job]
        finally:
            store.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_unit(self.proc, self.s, self.reservation)


def shared_spool(s: Site) -> Path:
    spool = s.root / "shared-spool"
    if not spool.exists():
        spool.mkdir(mode=0o711)
        os.chown(spool, s.uids[CONTROLLER], s.uids[CONTROLLER])
    return spool


def submit(
    s: Site,
    user: str,
    reservation: str,
    lo: int,
    hi: int,
    *job_args: str,
    spool: Path,
    options: Sequence[str] = (),
) -> int:
    """``user``'s pool job running JOB_SH with ``job_args``, through `hpcorch submit` with
    ``options`` (before the script)."""
    script = s.user_home(user) / "contract-job.sh"
    if not script.exists():
        script.write_text(JOB_SH)
        os.chown(script, s.uids[user], s.uids[CONTROLLER])
        script.chmod(0o755)
    env = s.user_env(user, HPCORCH_SPOOL=str(spool))
    out = s.as_user(
        user, PYTHON, "-m", "hpcorch", "submit", "--pool", reservation, "--mode", "managed",
        "--min-gpus", str(lo), "--max-gpus", str(hi), "--batch-size", "32", "--parsable",
        *options, str(script), *job_args, env=env,
    )  # fmt: skip
    return int(out.stdout.strip())


def pool_of(s: Site) -> Pool:
    return Pool(s.pool_dir, s.env, 2, 4, s.root)


def show(s: Site, job: int) -> str:
    return s.slurm("scontrol", "-o", "show", "job", str(job)).stdout
