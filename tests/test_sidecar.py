"""The sidecar's pure parts, and the sidecar process around a real script (no Slurm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcorch.policy.split import split_schedule
from hpcorch.policy.types import JobView, Plan, Snapshot, validate_plan
from hpcorch.protocol import EXIT_CONFIG, EXIT_LAUNCH_LOST, EXIT_RELAUNCH
from hpcorch.sidecar.config import (
    Progress,
    ProgressTracker,
    SidecarConfig,
    SidecarError,
    check_regex,
    config_from_env,
    latest_checkpoint,
    launch_command,
    parse_json_line,
    parse_output_line,
    signal_number,
)
from hpcorch.submit import detect_mode

REPO = Path(__file__).resolve().parents[1]


# --- configuration ---------------------------------------------------------------------------
def test_config_from_env_reads_every_option(tmp_path: Path) -> None:
    env = {
        "HPCORCH_JOB_DIR": str(tmp_path),
        "HPCORCH_STOP_SIGNAL": "sigusr1",
        "HPCORCH_STOP_GRACE": "7",
        "HPCORCH_SCRIPT_CKPT_DIR": "ck",
        "HPCORCH_RESUME_ARGS": json.dumps(["--resume", "{ckpt}"]),
        "HPCORCH_PROGRESS_REGEX": r"step (\d+)/(\d+)",
        "HPCORCH_CONTROLLED": "1",
    }
    cfg = config_from_env(env, tmp_path)
    assert cfg.stop_signal == "USR1" and cfg.grace_s == 7.0
    assert cfg.ckpt_dir == tmp_path / "ck" and cfg.resume_args == ("--resume", "{ckpt}")
    assert cfg.resumable and cfg.predictable and cfg.controlled


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("HPCORCH_STOP_SIGNAL", "NOPE", "unknown signal 'NOPE'"),
        ("HPCORCH_STOP_GRACE", "soon", "must be a number of seconds"),
        ("HPCORCH_RESUME_ARGS", "--resume", "must be a JSON list of strings"),
        ("HPCORCH_PROGRESS_REGEX", "step (", "does not compile"),
        ("HPCORCH_PROGRESS_REGEX", "step", "captures nothing"),
        ("HPCORCH_RESUME_ARGS", '["--resume", "{ckpt}"]', "no checkpoint directory"),
    ],
)
def test_config_errors_name_the_problem(tmp_path: Path, key: str, value: str, message: str) -> None:
    with pytest.raises(SidecarError, match=message):
        config_from_env({"HPCORCH_JOB_DIR": str(tmp_path), key: value}, tmp_path)


def test_signal_numbers() -> None:
    assert signal_number("TERM") == signal_number("SIGTERM") == signal_number("15") == 15
    with pytest.raises(SidecarError):
        signal_number("SIGFOO")


# --- progress ----------------------------------------------------------------------------------
def test_output_lines_positional_and_named_groups() -> None:
    rx = check_regex(r"step (\d+)/(\d+)")
    assert parse_output_line(rx, "epoch 0 step 12/400 loss 0.5") == Progress(12, 400)
    assert parse_output_line(rx, "nothing here") is None
    named = check_regex(r"it=(?P<step>\d+) loss=(?P<loss>[\d.]+)")
    assert parse_output_line(named, "it=7 loss=0.25") == Progress(7, None, None, 0.25)


def test_json_lines() -> None:
    assert parse_json_line('{"step": 5, "total": 10, "loss": 1.5}') == Progress(5, 10, None, 1.5)
    assert parse_json_line('{"loss": 1.5}') is None
    assert parse_json_line("not json") is None


def test_tracker_measures_step_time_without_start_up() -> None:
    t = ProgressTracker(gpus=2, global_batch=64, per_gpu_batch=32, interval_s=0.0)
    t.update(Progress(1), 100.0)  # after 100 s of start-up
    for i in range(2, 12):
        t.update(Progress(i), 100.0 + 0.5 * (i - 1))
    t.update(Progress(5), 200.0)  # another rank's stale line: ignored
    assert t.step_time() == pytest.approx(0.5)
    line = t.due(110.0)
    assert line is not None and line["step"] == 11 and line["samples_per_s"] == pytest.approx(128)
    assert t.due(111.0) is None  # nothing new
    assert t.step_at(102.0) == 5


# --- relaunch command --------------------------------------------------------------------------
def _cfg(tmp_path: Path, **kw: object) -> SidecarConfig:
    return SidecarConfig(job_dir=tmp_path, **kw)  # type: ignore[arg-type]


def test_launch_command_appends_resume_args_only_with_a_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    cfg = _cfg(tmp_path, ckpt_dir=ck, resume_args=("--resume", "{ckpt}"))
    cmd = ["python", "train.py", "--lr", "0.1"]
    assert launch_command(cmd, cfg, None, 3, "python") == (cmd, False)
    (ck / "a.pt").write_bytes(b"1")
    (ck / ".b.pt.tmp").write_bytes(b"2")  # being written: not a checkpoint
    latest = latest_checkpoint(ck)
    assert latest is not None and latest.path.name == "a.pt"
    new, resumed = launch_command(cmd, cfg, latest, 1, "python")
    assert resumed and new == [*cmd, "--resume", str(ck / "a.pt")]


def test_resume_command_replaces_the_script(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, resume_cmd=("train.py", "--resume-last"))
    assert launch_command(["x"], cfg, None, 0, "py") == (["x"], False)
    assert launch_command(["x"], cfg, None, 1, "py") == (["py", "train.py", "--resume-last"], True)


def test_detect_mode(tmp_path: Path) -> None:
    assert detect_mode(REPO / "examples" / "train_elastic.py") == "managed"
    assert detect_mode(REPO / "examples" / "train_plain.py") == "sidecar"
    other = tmp_path / "x.py"
    other.write_text("from hpcorch import runtime as hr\n")
    assert detect_mode(other) == "managed"
    other.write_text("# import hpcorch.runtime is only mentioned here\nimport torch\n")
    assert detect_mode(other) == "sidecar"
    # a training library's integration speaks the runtime's protocol: managed too
    assert detect_mode(REPO / "examples" / "train_transformers.py") == "managed"
    assert detect_mode(REPO / "examples" / "train_lightning_elastic.py") == "managed"
    for line in ("from hpcorch.integrations.lightning import Elastic",
                 "from hpcorch.integrations import transformers as hpt"):  # fmt: skip
        other.write_text(line + "\n")
        assert detect_mode(other) == "managed", line


# --- the split of fixed and unpredictable jobs ----------------------------------------------
class Greedy:
    """A stand-in policy: every job it sees gets its maximum where it fits."""

    name = "greedy"

    def __init__(self) -> None:
        self.seen: list[Snapshot] = []

    def schedule(self, snapshot: Snapshot) -> Plan:
        from hpcorch.policy.common import job_plan, place_packed

        self.seen.append(snapshot)
        free = list(snapshot.node_gpus)
        out = []
        for j in snapshot.jobs:
            placement = place_packed(free, j.max_gpus)
            if placement:
                out.append(job_plan(j, placement, j.min_batch))
        return Plan(tuple(out))


def _job(job_id: str, **kw: object) -> JobView:
    base: dict[str, object] = dict(
        application="a",
        submit_time=0.0,
        requested_gpus=1,
        requested_batch=32,
        min_gpus=1,
        max_gpus=4,
        min_batch=32,
        max_batch=32,
        min_micro_batch=1,
        max_micro_batch=32,
        max_epochs=1,
        progress_per_epoch_hint=10.0,
    )
    base.update(kw)
    return JobView(job_id=job_id, **base)  # type: ignore[arg-type]


def test_split_keeps_fixed_jobs_and_orders_unpredictable_by_attained_service() -> None:
    fixed = _job(
        "fixed",
        gpus=2,
        placement={0: 2},
        batch=32,
        micro_batch=16,
        accum_steps=1,
        resizable=False,
        min_gpus=4,
    )
    old = _job("old", predictable=False, requested_gpus=2, attained_service=5 * 3600.0)
    new = _job("new", predictable=False, requested_gpus=2, submit_time=50.0)
    modelled = _job("modelled", submit_time=10.0)
    snap = Snapshot(now=100.0, node_gpus=(4, 4), jobs=(fixed, old, new, modelled))
    inner = Greedy()
    plan = split_schedule(inner, snap).by_id()
    assert plan["fixed"].placement == {0: 2}  # kept, though below its (new) minimum
    # 6 free GPUs, 2 of 3 movable jobs unpredictable: a share of 4 -> both fit, the
    # least-served first
    assert plan["new"].gpus == 2 and plan["old"].gpus == 2
    assert [j.job_id for j in inner.seen[0].jobs] == ["modelled"]
    assert sum(inner.seen[0].node_gpus) == 2
    validate_plan(snap, Plan(tuple(p for k, p in plan.items() if k != "fixed")))


def test_split_share_leaves_the_most_served_unpredictable_job_waiting() -> None:
    jobs = [
        _job("u1", predictable=False, requested_gpus=4, attained_service=20 * 3600.0),
        _job("u2", predictable=False, requested_gpus=4),
        _job("m1", max_gpus=2),
        _job("m2", max_gpus=2),
    ]
    plan = split_schedule(Greedy(), Snapshot(now=0.0, node_gpus=(4, 4), jobs=tuple(jobs)))
    ids = plan.by_id()
    assert "u2" in ids and "u1" not in ids  # share 4 of 8: the least served runs
    assert {"m1", "m2"} <= set(ids)


def test_split_is_a_no_op_without_special_jobs() -> None:
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=(_job("a"),))
    assert split_schedule(Greedy(), snap) == Greedy().schedule(snap)


# --- the sidecar process around a real script -----------------------------------------------
SCRIPT = """
import json, os, signal, sys, time
ck = sys.argv[1]
start = 0
if "--from" in sys.argv:
    start = int(open(sys.argv[sys.argv.index("--from") + 1]).read())
stop = False
def on(sig, frame):
    global stop
    stop = True
signal.signal(signal.SIGUSR1, signal.SIG_IGN if os.environ.get("IGNORE") else on)
for step in range(start + 1, 400):
    print(f"step {step}/400", flush=True)
    time.sleep(0.02)
    if step % 10 == 0 or stop:
        with open(os.path.join(ck, ".tmp"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(ck, ".tmp"), os.path.join(ck, f"ck-{step:05d}"))
    if stop:
        sys.exit(0)
"""


def _run_sidecar(tmp_path: Path, launch: int, extra: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    (tmp_path / "ck").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_"))} | {
        "HPCORCH_JOB_DIR": str(tmp_path / "job"),
        "HPCORCH_LAUNCH": str(launch),
        "HPCORCH_STOP_SIGNAL": "USR1",
        "HPCORCH_STOP_GRACE": "2",
        "HPCORCH_SCRIPT_CKPT_DIR": str(tmp_path / "ck"),
        "HPCORCH_RESUME_CMD": json.dumps([str(script), str(tmp_path / "ck"), "--from", "{ckpt}"]),
        "HPCORCH_PROGRESS_REGEX": r"step (\d+)/(\d+)",
        "HPCORCH_METRICS_INTERVAL": "0.2",
        "HPCORCH_PYTHON": sys.executable,
        **extra,
    }
    cmd = [sys.executable, "-m", "hpcorch.sidecar", "0", sys.executable, str(script)]
    cmd.append(str(tmp_path / "ck"))
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "job" / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _wait_steps(tmp_path: Path, launch: int = 0) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        path = tmp_path / "job" / "metrics.jsonl"
        events = _events(tmp_path) if path.exists() else []
        if any(e.get("event") == "steps" and e.get("launch") == launch for e in events):
            return
        time.sleep(0.1)
    raise AssertionError("no progress reported")


def test_sidecar_stops_a_cooperative_script_and_resumes_it(tmp_path: Path) -> None:
    proc = _run_sidecar(tmp_path, 0, {})
    _wait_steps(tmp_path)
    proc.send_signal(signal.SIGUSR2)  # the controller's checkpoint signal
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_RELAUNCH, err
    ev = _events(tmp_path)
    stop = [e for e in ev if e["event"] == "stop"][-1]
    assert stop["graceful"] is True and stop["lost_steps_estimate"] == 0
    last = stop["last_step"]
    assert isinstance(last, int) and (tmp_path / "ck" / f"ck-{last:05d}").exists()
    # the relaunch runs the resume command and starts where the checkpoint was
    proc = _run_sidecar(tmp_path, 1, {})
    _wait_steps(tmp_path, 1)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert f"--from {tmp_path / 'ck' / f'ck-{last:05d}'}" in err
    resumed = [e for e in _events(tmp_path) if e["event"] == "resumed"]
    assert resumed and resumed[0]["previous_step"] == last


def test_sidecar_kills_a_script_that_ignores_the_stop(tmp_path: Path) -> None:
    proc = _run_sidecar(tmp_path, 0, {"IGNORE": "1"})
    _wait_steps(tmp_path)
    time.sleep(0.5)
    t0 = time.time()
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_RELAUNCH
    assert time.time() - t0 >= 2.0  # the grace period was given
    stop = [e for e in _events(tmp_path) if e["event"] == "stop"][-1]
    assert stop["graceful"] is False
    assert "did not exit within 2 s" in err


def test_sidecar_refuses_a_bad_configuration(tmp_path: Path) -> None:
    proc = _run_sidecar(tmp_path, 0, {"HPCORCH_STOP_SIGNAL": "BOGUS"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CONFIG
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        " hpcorch-sidecar[?]: error: unknown signal 'BOGUS'"
    )


LIGHTNING_LIKE = """
import os, signal, subprocess, sys, time
ck = sys.argv[1]
state = {"usr1": False, "term": False}
signal.signal(signal.SIGUSR1, lambda *a: state.update(usr1=True))
signal.signal(signal.SIGTERM, lambda *a: state.update(term=True))
for step in range(1, 100000):
    print(f"step {step}/100000", flush=True)
    time.sleep(0.02)
    if state["usr1"]:  # Lightning: save hpc_ckpt, `scontrol requeue`, and train on
        state["usr1"] = False
        open(os.path.join(ck, f"hpc_ckpt_{step}.ckpt"), "w").write(str(step))
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
    if state["term"]:  # Slurm's requeue ends the job with SIGTERM
        sys.exit(1)
"""


def test_sidecar_stops_a_script_that_asked_to_be_requeued(tmp_path: Path) -> None:
    """Under the controller, Lightning's `scontrol requeue` on its signal becomes a relaunch
    request; Lightning trains on after it (Slurm would end the job), so the sidecar stops
    it with SIGTERM as Slurm would, instead of waiting for the grace period and killing it.
    The shim works on a node without Slurm's scontrol too."""
    script = tmp_path / "l.py"
    script.write_text(LIGHTNING_LIKE)
    (tmp_path / "ck").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_"))} | {
        "PATH": os.path.dirname(sys.executable) + ":/bin:/usr/bin",  # no Slurm here
        "HPCORCH_JOB_DIR": str(tmp_path / "job"),
        "HPCORCH_STOP_SIGNAL": "USR1",
        "HPCORCH_STOP_GRACE": "30",
        "HPCORCH_SCRIPT_CKPT_DIR": str(tmp_path / "ck"),
        "HPCORCH_PROGRESS_REGEX": r"step (\d+)/(\d+)",
        "HPCORCH_METRICS_INTERVAL": "0.2",
        "HPCORCH_CONTROLLED": "1",
    }
    # `env VAR=...` stands in for srun: it gives the task its job id
    launcher = ["env", "SLURM_JOB_ID=4242"]
    cmd = [sys.executable, "-m", "hpcorch.sidecar", str(len(launcher)), *launcher]
    proc = subprocess.Popen(
        [*cmd, sys.executable, str(script), str(tmp_path / "ck")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_steps(tmp_path)
    t0 = time.time()
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_RELAUNCH, err
    assert time.time() - t0 < 15  # not the 30 s grace
    assert (tmp_path / "job" / "requeue-requested").exists()
    assert "asked to be requeued: SIGTERM" in err
    stop = [e for e in _events(tmp_path) if e["event"] == "stop"][-1]
    assert stop["graceful"] is True and str(stop["checkpoint"]).endswith(".ckpt")
    assert stop["lost_steps_estimate"] <= 25  # the steps of one poll of the sidecar (0.2 s)


SHOW_JOB = "JobId=7 JobName=t JobState=RUNNING Reason=None Restarts=1 NodeList=gpu-a[001-002]"


@pytest.mark.parametrize(
    ("owner", "info", "node_failure", "why"),
    [
        ("7 1\n", SHOW_JOB, False, None),  # a result
        (None, None, False, None),  # not fenced, Slurm not asked: nothing says it is lost
        ("7 2\n", SHOW_JOB, False, "launch 3 of job 7 owns the job directory now"),
        ("9 0\n", SHOW_JOB, False, "launch 1 of job 9 owns"),
        ("7 1\n", SHOW_JOB.replace("Restarts=1", "Restarts=2"), False, "requeued the job"),
        ("7 1\n", SHOW_JOB.replace("RUNNING", "PENDING"), False, "holds the job as PENDING"),
        ("7 1\n", SHOW_JOB.replace("Reason=None", "Reason=NodeDown"), False, "node of the job"),
        ("7 1\n", SHOW_JOB, True, "srun reported a node failure"),
        (None, None, True, "srun reported a node failure"),
    ],
)
def test_launch_lost_decision(
    owner: str | None, info: str | None, node_failure: bool, why: str | None
) -> None:
    from hpcorch.sidecar.lost import lost_reason

    got = lost_reason("7", 1, owner, info, node_failure)
    assert got == why if why is None else (got is not None and why in got), got


def test_node_failure_lines() -> None:
    from hpcorch.sidecar.lost import node_failure_line

    assert node_failure_line(b"srun: error: Node failure on gpu-a002\n")
    assert not node_failure_line(b"step 3/10 Node failure on x\n")  # the script's own output
    assert not node_failure_line(b"srun: error: gpu-a001: task 0: Exited with exit code 1\n")


FAKE_SRUN = """#!/bin/bash
# srun that loses a node yet exits 0, as Slurm 22.05's srun does (the script's ranks
# elsewhere finish normally)
[[ -n ${LOSE_NODE-} ]] && echo "srun: error: Node failure on gpu-a002" >&2
"$@"
"""


@pytest.mark.parametrize("lose", [False, True])
def test_sidecar_never_reports_success_after_a_node_failure(tmp_path: Path, lose: bool) -> None:
    """The sidecar job's no-false-success check: the script exits 0, but srun reported a
    node failure: exit 79 (EXIT_LAUNCH_LOST), no 'training finished', no requeue."""

    srun = tmp_path / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "launch").write_text("4242 0\n")  # the wrapper's fence: this launch
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_"))} | {
        "PATH": os.path.dirname(sys.executable) + ":/bin:/usr/bin",  # no scontrol
        "SLURM_JOB_ID": "4242",
        "HPCORCH_JOB_DIR": str(tmp_path / "job"),
        "HPCORCH_LAUNCH": "0",
        "HPCORCH_PROGRESS_REGEX": r"step (\d+)/(\d+)",
        **({"LOSE_NODE": "1"} if lose else {}),
    }
    script = [sys.executable, "-c", "print('step 1/1', flush=True)"]
    done = subprocess.run(
        [sys.executable, "-m", "hpcorch.sidecar", "1", str(srun), *script],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if not lose:
        assert done.returncode == 0 and "training finished" in done.stderr, done.stderr
        return
    assert done.returncode == EXIT_LAUNCH_LOST, done.stderr
    assert "training finished" not in done.stderr and "requeue" not in done.stderr
    assert "launch 1 lost a node or a rank (srun reported a node failure)" in done.stderr


BAR = """\
import sys, time
for step in range(1, 301):
    sys.stderr.write(f"\\r{step * 100 // 300:3d}%|####| {step}/300 [00:01<00:02, 50.0it/s]")
    sys.stderr.flush()
    time.sleep(0.02)
sys.stderr.write("\\n")
"""


def test_a_progress_bar_that_rewrites_its_line_is_read_as_it_moves(tmp_path: Path) -> None:
    """tqdm (the Hugging Face Trainer's bar, Lightning's) rewrites one line with ``\\r``
    and ends it only when it closes: the sidecar reads each update, not the last alone."""
    script = tmp_path / "bar.py"
    script.write_text(BAR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_"))} | {
        "HPCORCH_JOB_DIR": str(tmp_path / "job"),
        "HPCORCH_PROGRESS_REGEX": r"(\d+)/(\d+) \[",
        "HPCORCH_METRICS_INTERVAL": "0.2",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcorch.sidecar", "0", sys.executable, str(script)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_steps(tmp_path)
        assert proc.poll() is None  # reported while the bar still moves
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert b"300/300 [" in err  # passed through as it was written
    steps = [e for e in _events(tmp_path) if e["event"] == "steps"]
    assert len(steps) >= 3 and steps[-1]["step"] == 300, steps


def _sidecar_under_launcher(
    tmp_path: Path, launcher: list[str], timeout: str
) -> subprocess.CompletedProcess[str]:
    """The sidecar as the wrapper execs it (HPCORCH_TASK_START_TIMEOUT set), with
    ``launcher`` standing in for srun and its task shim; a script that exits 0 at once."""
    script = tmp_path / "s.py"
    script.write_text("print('step 1/1', flush=True)\n")
    (tmp_path / "job").mkdir(exist_ok=True)
    (tmp_path / "job" / "task-started").write_text("0\n")  # an earlier launch's mark
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_"))} | {
        "HPCORCH_JOB_DIR": str(tmp_path / "job"),
        "HPCORCH_LAUNCH": "1",
        "HPCORCH_PROGRESS_REGEX": r"step (\d+)/(\d+)",
        "HPCORCH_PYTHON": sys.executable,
        "HPCORCH_TASK_START_TIMEOUT": timeout,
    }
    cmd = [sys.executable, "-m", "hpcorch.sidecar", str(len(launcher)), *launcher]
    return subprocess.run(
        [*cmd, sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=90
    )  # fmt: skip


def test_sidecar_stops_srun_whose_tasks_never_start(tmp_path: Path) -> None:
    """A step Slurm never starts leaves srun waiting: past the timeout it is stopped and
    the launch is no result (79), as in the wrapper's runtime path."""
    began = time.monotonic()
    run = _sidecar_under_launcher(tmp_path, ["sh", "-c", "exec sleep 120", "srun"], "2")
    assert run.returncode == EXIT_LAUNCH_LOST, run.stderr
    assert "no task of launch 2 started within 2 s (HPCORCH_TASK_START_TIMEOUT)" in run.stderr
    assert "after waiting 2 s for its step: not a result" in run.stderr
    assert time.monotonic() - began < 60


@pytest.mark.parametrize(("writes", "want"), [(True, 0), (False, EXIT_LAUNCH_LOST)])
def test_sidecar_counts_exit_0_as_done_only_when_a_task_started(
    tmp_path: Path, writes: bool, want: int
) -> None:
    """srun can exit 0 without running a task: no result unless this launch's rank 0 said
    it started (the wrapper's shim writes the launch's number; an earlier one is cleared)."""
    shim = 'echo "$HPCORCH_LAUNCH" > "$HPCORCH_JOB_DIR/task-started"; ' if writes else ""
    launcher = ["sh", "-c", shim + 'exec "$@"', "srun"]
    run = _sidecar_under_launcher(tmp_path, launcher, "0")
    assert run.returncode == want, run.stderr
    assert ("training finished" in run.stderr) == writes, run.stderr
    if not writes:
        assert "srun exited 0, but no task of launch 2 started: not a result" in run.stderr


def test_sidecar_refuses_a_bad_task_start_timeout(tmp_path: Path) -> None:
    run = _sidecar_under_launcher(tmp_path, ["env"], "5 min")
    assert run.returncode == EXIT_CONFIG, run.stderr
    assert "HPCORCH_TASK_START_TIMEOUT must be a whole number of seconds" in run.stderr
    assert "Traceback" not in run.stderr
