"""benchmarks/light_job.py, the featherweight emulated job: the job protocol as the runtime
speaks it (plan, start report, steps lines, checkpoint on the signal and exit 75 as the
wrapper expects it, exact resume, a live batch change, the end), without torch; and its
application profile (benchmarks/light_profile.py) against the simulator's model."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.light_profile import Profile, make_profile, write_profiles
from benchmarks.site_pool import StepTimeServer
from hpcorch.sim.traces import load_apps

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "benchmarks" / "light_job.py"


def test_the_profile_gives_the_simulators_gains_and_measured_step_times() -> None:
    rng = random.Random(0)
    for name, app in load_apps().items():
        a = app.scaled(0.05)
        prof = Profile(json.loads(json.dumps(make_profile(a))))
        assert prof.epoch_end == pytest.approx(list(a.epoch_end), rel=1e-12)
        want_bounds = (a.init_batch, a.max_batch, a.epochs)
        assert (prof.init_batch, prof.max_batch, prof.epochs) == want_bounds
        for _ in range(200):
            b, e = rng.randint(a.init_batch, a.max_batch), rng.randint(0, a.epochs - 1)
            assert prof.gain(b, e) == pytest.approx(a.gain(b, e), rel=1e-12), (name, b, e)
        for placement in a._placements:  # measured: the same 1-D interpolation
            micro = rng.randint(a.min_micro, a.max_micro)
            accum = rng.randint(1, 4)
            want = a.iteration_time(placement, micro, accum)
            assert prof.iteration_time(placement, micro, accum) == pytest.approx(want, rel=1e-12)


def _env(job_dir: Path, plan: Path, launch: int, world: int, fake: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{fake}:{REPO}",  # a torch that cannot be imported comes first
        "HPCORCH_JOB_DIR": str(job_dir),
        "HPCORCH_JOB_ID": "job-1",
        "HPCORCH_PLAN": str(plan),
        "HPCORCH_LAUNCH": str(launch),
        "HPCORCH_QUIET_RELAUNCH": "1",
        "HPCORCH_METRICS_INTERVAL": "1",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
    }


def _plan(path: Path, batch: int, gpus: int, launch: int) -> None:
    doc = {"version": 1, "global_batch": batch, "gpus": gpus, "max_micro_batch": 256,
           "job": "job-1", "launch": launch, "placement": [["n1", gpus]]}  # fmt: skip
    path.with_suffix(".tmp").write_text(json.dumps(doc))
    path.with_suffix(".tmp").replace(path)


def _lines(job_dir: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (job_dir / "metrics.jsonl").read_text().splitlines()]


def _wait(what: str, cond: object, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not cond():  # type: ignore[operator]
        assert time.time() < deadline, what
        time.sleep(0.1)


def test_the_light_job_speaks_the_runtimes_protocol_without_torch(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    profiles = write_profiles(tmp_path / "profiles", 0.01)
    job_dir, plan = tmp_path / "job", tmp_path / "plan.json"
    sock = tmp_path / "times.sock"
    server = StepTimeServer(sock)
    argv = [sys.executable, str(JOB), "--profile", str(profiles["cifar10"]),
            "--step-times", str(sock), "--time-scale", "0.01"]  # fmt: skip
    try:
        # launch 1 on 2 GPUs: trains, then checkpoints on the signal
        _plan(plan, 256, 2, 0)
        job = subprocess.Popen(argv, env=_env(job_dir, plan, 0, 2, fake), stderr=subprocess.PIPE)
        _wait("steps lines", lambda: (job_dir / "metrics.jsonl").exists()
              and any(x["event"] == "steps" for x in _lines(job_dir)))  # fmt: skip
        job.send_signal(signal.SIGUSR2)
        assert job.wait(60) == 0, job.stderr.read() if job.stderr else ""  # quiet relaunch
        lines = _lines(job_dir)
        kinds = [x["event"] for x in lines]
        assert kinds[:2] == ["start", "first_step"] and kinds[-2:] == ["checkpoint", "exit"]
        start = lines[0]
        assert start["model"] == "cifar10" and start["epochs"] == 100 and start["step"] == 0
        steps = [x for x in lines if x["event"] == "steps"]
        app = load_apps()["cifar10"].scaled(0.01)
        assert steps[-1]["step_time"] == pytest.approx(app.iteration_time((2,), 128, 1))
        assert steps[-1]["gpus"] == 2 and steps[-1]["global_batch"] == 256
        ckpt = lines[-2]
        assert ckpt["reason"] == "signal" and ckpt["signal_time"] and lines[-1]["code"] == 75
        beat = json.loads((job_dir / "heartbeat").read_text())
        assert beat["state"] == "exit 75" and beat["launch"] == 0
        stopped = int(ckpt["step"])  # type: ignore[call-overload]
        saved = json.loads(Path(str(ckpt["path"])).read_text())
        # launch 2 on 4 GPUs resumes exactly there, takes a new batch live, and finishes
        _plan(plan, 512, 4, 1)
        job = subprocess.Popen(argv, env=_env(job_dir, plan, 1, 4, fake), stderr=subprocess.PIPE)
        _wait("launch 2 trains", lambda: any(
            x["event"] == "steps" and x.get("launch") == 1 for x in _lines(job_dir)))  # fmt: skip
        _plan(plan, 1024, 4, 1)
        assert job.wait(120) == 0
        second = [x for x in _lines(job_dir) if x.get("launch") == 1]
        assert second[0]["event"] == "start" and second[0]["step"] == stopped
        assert second[0]["resumed"] is True and second[0]["epoch"] == saved["stat_epoch"]
        rebatch = next(x for x in second if x["event"] == "rebatch")
        assert (rebatch["from_batch"], rebatch["global_batch"]) == (512, 1024)
        after = [x for x in second if x["event"] == "steps" and x["step"] > rebatch["step"]]
        assert after and all(x["global_batch"] == 1024 for x in after)
        assert [x["event"] for x in second[-2:]] == ["checkpoint", "done"]
        assert second[-1]["step"] > stopped and after[-1]["epoch"] == 100
        assert json.loads((job_dir / "heartbeat").read_text())["state"] == "done"
    finally:
        server.close()


def test_other_ranks_leave_at_once_and_a_bad_plan_is_one_line(tmp_path: Path) -> None:
    profiles = write_profiles(tmp_path / "profiles", 0.01)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "RANK": "3"}
    argv = [sys.executable, str(JOB), "--profile", str(profiles["bert"])]
    assert subprocess.run(argv, env=env, capture_output=True).returncode == 0
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    env = _env(tmp_path / "job", plan, 0, 1, tmp_path)
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert res.returncode == 78
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
