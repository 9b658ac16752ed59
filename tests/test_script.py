"""The batch-script renderer: golden file, quoting, validation, shapes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcorch.protocol import EXIT_LAUNCH_LOST
from hpcorch.request import RequestError, setup_lines
from hpcorch.slurm.script import (
    JobSpec,
    SidecarSpec,
    SpecError,
    choose_shape,
    parse_comment,
    render_batch_script,
)

GOLDEN = Path(__file__).parent / "golden" / "batch_script.sbatch"
NASTY = ("a b", "it's", '"double"', "$HOME", "x; rm -rf /", "`date`", "\\n", "", "--tag=*")


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        job_key="train-20260101-000000-abcd",
        name="train",
        script="/home/u/train.py",
        script_args=("--epochs", "2", "--note", "two words; $HOME"),
        nodes=2,
        gpus_per_node=2,
        min_gpus=4,
        max_gpus=8,
        job_dir="/home/u/.hpcorch/jobs/train-20260101-000000-abcd",
        wrapper="/opt/hpcorch/jobscripts/hpcorch-run.sbatch",
        cpus_per_gpu=4,
        global_batch=256,
        max_global_batch=2048,
        partition="gpu",
        time_limit="2:00:00",
        python="/opt/venv/bin/python",
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def test_matches_golden_file() -> None:
    text = render_batch_script(spec())
    if os.environ.get("HPCORCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


GOLDEN_SIDECAR = Path(__file__).parent / "golden" / "batch_script_sidecar.sbatch"


def test_sidecar_script_matches_golden_file() -> None:
    """Every sidecar option reaches the wrapper as an environment variable, quoted."""
    side = SidecarSpec(
        stop_signal="USR1",
        grace_s=90,
        ckpt_dir="/home/u/run 1/ckpt",
        resume_args=("--resume", "{ckpt}"),
        progress_regex=r"step (\d+)/(\d+) loss=\S+ '$x'",
        progress_file="/home/u/progress.jsonl",
    )
    text = render_batch_script(spec(sidecar=side, managed=True, reservation="pool"))
    if os.environ.get("HPCORCH_UPDATE_GOLDEN"):
        GOLDEN_SIDECAR.write_text(text)
    assert text == GOLDEN_SIDECAR.read_text()
    assert ",mode=sidecar,grace=90," in text
    unresumable = render_batch_script(spec(sidecar=SidecarSpec()))
    assert "resume=no" in unresumable and "progress=no" in unresumable


def test_script_arguments_reach_the_wrapper_unchanged(tmp_path: Path) -> None:
    """Run the rendered script with bash, a stand-in wrapper records its argv."""
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(
        "import json, sys\njson.dump(sys.argv[1:], open(sys.argv[0] + '.out', 'w'))\n"
    )
    # `exec bash WRAPPER ...`: make "bash" run python on the wrapper instead
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "bash").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (fake_bin / "bash").chmod(stat.S_IRWXU)
    script = render_batch_script(spec(wrapper=str(wrapper), script_args=NASTY))
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    subprocess.run(["/bin/bash", "-c", script], env=env, check=True)
    argv = json.loads((tmp_path / "wrapper.sh.out").read_text())
    assert argv == ["/home/u/train.py", *NASTY]


def test_setup_lines_run_before_the_job_in_its_shell(tmp_path: Path) -> None:
    """`--setup` lines run in the batch script's shell before the wrapper (a module load, a
    variable the job sees); a line that is not one line, or blank, is refused."""
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text("import json, os\njson.dump(os.environ['FROM_SETUP'], open('seen', 'w'))\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "bash").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (fake_bin / "bash").chmod(stat.S_IRWXU)
    lines = ('export FROM_SETUP="set up; $((6 * 7))"', "cd " + str(tmp_path))
    script = render_batch_script(spec(wrapper=str(wrapper), setup=lines))
    assert script.index(lines[1]) < script.index("exec bash")
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    subprocess.run(["/bin/bash", "-c", script], env=env, check=True, cwd="/")
    assert json.loads((tmp_path / "seen").read_text()) == "set up; 42"
    for bad in (["a\nb"], [""], ["x" * 1001], ["true"] * 33, ["a\0"]):
        with pytest.raises(RequestError, match="--setup"):
            setup_lines(bad)
    assert setup_lines(["module load cuda"]) == ("module load cuda",)


def test_comment_round_trips() -> None:
    fields = parse_comment(spec().comment())
    assert fields == {
        "id": "train-20260101-000000-abcd",
        "min": "4",
        "max": "8",
        "batch": "256",
        "maxbatch": "2048",
    }
    assert parse_comment("some other job") is None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"name": "two words"}, "invalid job name"),
        ({"name": "x" * 65}, "invalid job name"),
        ({"time_limit": "2 hours"}, "invalid time limit"),
        ({"job_dir": "/home/my jobs/x"}, "job directory"),
        ({"partition": "gpu;rm"}, "partition"),
    ],
)
def test_rejects_what_an_sbatch_line_cannot_hold(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        render_batch_script(spec(**kw))


@pytest.mark.parametrize("limit", ["30", "10:00", "2:00:00", "1-12", "1-12:30", "2-00:00:00"])
def test_accepts_slurm_time_formats(limit: str) -> None:
    assert f"--time={limit}" in render_batch_script(spec(time_limit=limit))


@pytest.mark.parametrize(
    ("gpus", "per_node", "nodes", "expected"),
    [
        (1, 4, 4, (1, 1)),
        (2, 4, 4, (1, 2)),
        (4, 4, 4, (1, 4)),
        (6, 4, 4, (2, 3)),
        (8, 4, 4, (2, 4)),
        (5, 4, 8, (5, 1)),
        (16, 4, 4, (4, 4)),
    ],
)
def test_shape_uses_fewest_even_nodes(
    gpus: int, per_node: int, nodes: int, expected: tuple[int, int]
) -> None:
    assert choose_shape(gpus, per_node, nodes) == expected


def test_shape_that_cannot_be_even_is_an_error() -> None:
    with pytest.raises(SpecError, match="cannot be spread evenly"):
        choose_shape(5, 4, 4)


FAKE_SRUN = """#!/bin/sh
# rank 0 says it started, as the wrapper's task shim does (not when FAKE_NO_TASK is set)
[ -n "$FAKE_NO_TASK" ] || echo "$HPCORCH_LAUNCH" > "$HPCORCH_JOB_DIR/task-started"
# a step Slurm accepted and never started: srun waits (until it is stopped)
[ -n "$FAKE_WAIT" ] && exec sleep "$FAKE_WAIT"
if [ -n "$FAKE_BEAT" ]; then
  printf '{"time": %s, "step": 3, "state": "%s"}' "$(date +%s)" "$FAKE_BEAT" \\
    > "$HPCORCH_JOB_DIR/heartbeat"
fi
exit "$FAKE_RC"
"""


# Slurm's side of a requeue the wrapper asks for: scontrol accepts it and, as a slow
# slurmctld does, ends the batch script (SIGTERM to its process group, which the helper
# below makes the wrapper lead) only FAKE_END_S seconds later; a
# checkpoint signal the controller sends again meanwhile (FAKE_RESIGNAL) reaches the
# wrapper first. FAKE_REQUEUE lists what becomes of each request in turn: "ok" (the
# default), "lost" (not answered, not done: a timeout), "late" (done, its answer lost; or
# the controller's requeue came first). `show job` says the job runs, launch 0, until a
# requeue was done: then it is COMPLETING, restart 1.
FAKE_SCONTROL = """#!/bin/bash
case $1 in
  requeue|requeuehold)
    echo "$*" >> "$HPCORCH_JOB_DIR/scontrol-calls"
    IFS=, read -ra fate <<<"${FAKE_REQUEUE:-ok}"
    n=$(grep -c requeue "$HPCORCH_JOB_DIR/scontrol-calls")
    what=${fate[n - 1]:-ok}
    if [ "$what" = lost ]; then
      echo "scontrol: error: Socket timed out on send/recv operation" >&2
      exit 1
    fi
    touch "$HPCORCH_JOB_DIR/requeued"
    wrapper=$PPID
    ( [ -n "$FAKE_RESIGNAL" ] && { sleep 0.3; kill -USR2 "$wrapper"; }
      sleep "${FAKE_END_S:-0.5}"; kill -TERM -- "-$wrapper" ) >/dev/null 2>&1 &
    if [ "$what" = late ]; then
      echo "scontrol: error: Socket timed out on send/recv operation" >&2
      exit 1
    fi
    exit 0 ;;
  -o)
    if [ -e "$HPCORCH_JOB_DIR/requeued" ]; then
      echo "JobId=$SLURM_JOB_ID JobState=COMPLETING Restarts=1"
    else
      echo "JobId=$SLURM_JOB_ID JobState=RUNNING Restarts=0"
    fi ;;
esac
"""


def _wrapper_under_fake_srun(
    tmp_path: Path, *, beat: str = "", rc: int = 0, **env: str
) -> subprocess.CompletedProcess[str]:
    """The job wrapper run outside Slurm, its srun and scontrol the fakes above (srun's exit
    code ``rc``, the heartbeat ``beat`` of this launch); ``tmp_path / "job"`` its job
    directory."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(stat.S_IRWXU)
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    full = {
        **os.environ,
        "PATH": f"{fake_bin}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n1",
        "MASTER_ADDR": "127.0.0.1",
        "HPCORCH_JOB_DIR": str(job_dir),
        "HPCORCH_PYTHON": sys.executable,
        "FAKE_BEAT": beat,
        "FAKE_RC": str(rc),
        **env,
    }
    wrapper = Path(__file__).parent.parent / "jobscripts" / "hpcorch-run.sbatch"
    return subprocess.run(
        ["bash", str(wrapper), "train.py"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    ("beat", "rc", "stale", "want"),
    [
        ("done", 134, False, 0),  # aborted in teardown after every rank finished
        ("running", 134, False, 134),  # died while training: a failure
        ("done", 1, False, 1),  # a Python error after training stays an error
        ("done", 134, True, 134),  # a "done" from an earlier launch says nothing
    ],
)
def test_wrapper_counts_a_teardown_abort_after_training_as_finished(
    tmp_path: Path, beat: str, rc: int, stale: bool, want: int
) -> None:
    """gloo can abort a finished rank while the process exits; the wrapper trusts the
    runtime's "done" heartbeat of this launch (written after every rank's last step)."""
    if stale:
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "heartbeat").write_text(json.dumps({"time": 1.0, "state": beat}))
    run = _wrapper_under_fake_srun(tmp_path, beat="" if stale else beat, rc=rc)
    assert run.returncode == want, run.stderr
    assert ("counted as finished" in run.stderr) == (want == 0), run.stderr


def test_wrapper_counts_srun_exit_0_without_a_task_as_no_result(tmp_path: Path) -> None:
    """srun exiting 0 when no task of the launch started is not training finished: 79."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "task-started").write_text("0\n")  # an earlier try's: cleared
    run = _wrapper_under_fake_srun(tmp_path, FAKE_NO_TASK="1")
    assert run.returncode == EXIT_LAUNCH_LOST, run.stderr
    assert "no task of launch 1 started" in run.stderr
    assert "training finished" not in run.stderr


def test_wrapper_counts_srun_failing_before_a_task_started_as_no_result(tmp_path: Path) -> None:
    """srun exits 1 when it cannot start its step (slurmctld stopped: "Socket timed out"):
    no task ran, so nothing failed in training: 79, not a failure of the job's."""
    run = _wrapper_under_fake_srun(tmp_path, rc=1, FAKE_NO_TASK="1")
    assert run.returncode == EXIT_LAUNCH_LOST, run.stderr
    assert "srun exited 1, but no task of launch 1 started: not a result" in run.stderr


def test_wrapper_stops_srun_whose_tasks_never_start(tmp_path: Path) -> None:
    """srun waiting for a step Slurm never starts would hold the job's GPUs for ever: past
    HPCORCH_TASK_START_TIMEOUT it is stopped and the launch is no result (79), for the
    controller to start the job again."""
    began = time.monotonic()
    run = _wrapper_under_fake_srun(
        tmp_path, FAKE_NO_TASK="1", FAKE_WAIT="120", HPCORCH_TASK_START_TIMEOUT="2"
    )
    took = time.monotonic() - began
    assert run.returncode == EXIT_LAUNCH_LOST, run.stderr
    assert "no task of launch 1 started within 2 s" in run.stderr
    assert "srun stopped (exit code 143) after waiting 2 s for its step: not a result" in run.stderr
    assert took < 60, took


def test_wrapper_leaves_a_launch_whose_task_started(tmp_path: Path) -> None:
    """The timeout is for a task to start, not for training: a run longer than it whose
    task started is left to finish."""
    run = _wrapper_under_fake_srun(tmp_path, FAKE_WAIT="3", HPCORCH_TASK_START_TIMEOUT="1")
    assert run.returncode == 0, run.stderr
    assert "stopping srun" not in run.stderr
    assert "training finished" in run.stderr
    assert not (tmp_path / "job" / "task-start-timeout").exists()


@pytest.mark.parametrize("value", ["5m", "-1", "1e3", "9999999", "3; touch x"])
def test_wrapper_refuses_a_bad_task_start_timeout(tmp_path: Path, value: str) -> None:
    run = _wrapper_under_fake_srun(tmp_path, HPCORCH_TASK_START_TIMEOUT=value)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert lines[-1].startswith("hpcorch-run[7]: HPCORCH_TASK_START_TIMEOUT must be a whole"), lines
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("resignal", [False, True])
def test_wrapper_requeue_ends_as_a_requeue_when_signalled_again(
    tmp_path: Path, resignal: bool
) -> None:
    """After a checkpoint on request the wrapper requeues its job held and exits 0 when
    Slurm ends it, so accounting shows a requeue. A slow slurmctld can take seconds to end
    it, and the controller signals a job still running again: that signal must not cut
    the wait short and turn the requeue into a failed batch step (exit 75)."""
    run = _wrapper_under_fake_srun(
        tmp_path,
        beat="exit 75",
        HPCORCH_CONTROLLED="1",
        FAKE_END_S="2",
        FAKE_RESIGNAL="1" if resignal else "",
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "job" / "scontrol-calls").read_text().split() == [
        "requeuehold", "State=SpecialExit", "7",
    ]  # fmt: skip
    assert "requeued held for the controller's relaunch" in run.stderr
    assert "the requeue failed" not in run.stderr


@pytest.mark.parametrize(
    ("fates", "calls", "want"),
    [
        ("late", 1, 0),  # done, its answer lost (or the controller requeued it first)
        ("lost,ok", 2, 0),  # not answered: asked again
        ("lost,late", 2, 0),
        ("lost,lost,lost", 3, 75),  # never done: exit 75, the controller requeues it
    ],
)
def test_wrapper_requeue_survives_a_lost_answer(
    tmp_path: Path, fates: str, calls: int, want: int
) -> None:
    """Seen in CI (25.11, lanes side by side): a resize's launch ended as a FAILED batch
    step with exit code 75 though the job was requeued (sacct: REQUEUED), because the
    wrapper's `scontrol requeuehold` failed and the wrapper exited at once. A failed
    request may have been carried out (a busy slurmctld's answer timed out, or the
    controller's forced requeue came first): the wrapper looks whether the job was
    requeued, and asks again a few times when it was not."""
    run = _wrapper_under_fake_srun(
        tmp_path,
        beat="exit 75",
        HPCORCH_CONTROLLED="1",
        FAKE_REQUEUE=fates,
    )
    assert run.returncode == want, run.stderr
    asked = (tmp_path / "job" / "scontrol-calls").read_text().splitlines()
    assert asked == ["requeuehold State=SpecialExit 7"] * calls, asked
    assert ("the requeue failed" in run.stderr) == (want != 0), run.stderr
