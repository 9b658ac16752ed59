"""squeue's habits in ``status``, ``cancel`` of many, the launches in a job's output, and
the Python API's function runner: pure parts and CLI parsing, no Slurm."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch import fnjob
from hpcorch.api import Executor, Job, JobError
from hpcorch.apibase import request_kwargs
from hpcorch.cli import main
from hpcorch.cli.status import select_for_cancel
from hpcorch.joblogs import find_job_dir, is_over, launch_slice, launches, pooled_job
from hpcorch.request import RequestError
from hpcorch.slurm.parse import SlurmJob
from hpcorch.status import FormatError, Managed, job_rows, render_jobs, status_document

SCRIPT = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def sjob(job_id: int, **kw: object) -> SlurmJob:
    base: dict[str, object] = dict(
        job_id=job_id,
        name="train",
        user="alice",
        state="RUNNING",
        reason="None",
        partition="gpu",
        nodes="n1",
        node_count=1,
        gpus_per_node=2,
        comment=f"hpcorch:id=train-{job_id},min=1,max=4,batch=64",
        submit_time=100,
        start_time=100,
        end_time=0,
        time_limit_min=90,
        restarts=0,
        exit_code=0,
        work_dir="/tmp",
        reservation="",
        held=False,
        account="proj",
        qos="normal",
    )
    base.update(kw)
    return SlurmJob(**base)  # type: ignore[arg-type]


JOBS = [
    sjob(11),
    sjob(12, user="bob", name="bert", state="PENDING", reason="Resources", nodes=""),
    sjob(13, state="COMPLETED", end_time=200),
    sjob(14, comment="not hpcorch"),
]


def test_status_filters_as_squeue_does() -> None:
    ids = lambda rows: [r.job_id for r in rows]  # noqa: E731
    assert ids(job_rows(JOBS, 1000)) == [11, 12, 13]
    assert ids(job_rows(JOBS, 1000, user=["bob"])) == [12]
    assert ids(job_rows(JOBS, 1000, job_ids=[11, 13])) == [11, 13]
    assert ids(job_rows(JOBS, 1000, states=["PD"])) == [12]
    assert ids(job_rows(JOBS, 1000, states=["running", "CD"])) == [11, 13]
    assert ids(job_rows(JOBS, 1000, names=["bert"])) == [12]
    managed = {11: Managed("stopping", "resize: 2 -> 4 GPUs", 64, 32, 1, 100.0, 1)}
    assert ids(job_rows(JOBS, 1000, managed=managed, phases=["stopping"])) == [11]


def test_state_and_phase_are_separate_columns() -> None:
    managed = {11: Managed("stopping", "resize: 2 -> 4 GPUs", 64, 32, 1, 100.0, 1)}
    text = render_jobs(job_rows(JOBS, 1000, managed=managed))
    head, row11 = text.splitlines()[:2]
    assert head.split()[:7] == ["JOBID", "NAME", "USER", "MODE", "STATE", "PHASE", "GPUS"]
    assert row11.split()[4:6] == ["RUNNING", "STOPPING"]
    assert "15:00" in row11 and "1:30:00" in row11  # run time and limit, as squeue prints


def test_squeue_percent_format_and_field_names() -> None:
    rows = job_rows(JOBS, 1000)
    assert render_jobs(rows, "%.5i|%6j|%t|%a|%q", header=False).splitlines() == [
        "   11|train |R|proj|normal",
        "   12|bert  |PD|proj|normal",
        "   13|train |CD|proj|normal",
    ]
    named = render_jobs(rows, "jobid,phase,timelimit").splitlines()
    assert named[0].split() == ["JOBID", "PHASE", "TIME_LIMIT"]
    assert named[1].split() == ["11", "-", "1:30:00"]
    with pytest.raises(FormatError, match="unknown format field %Z"):
        render_jobs(rows, "%Z")
    with pytest.raises(FormatError, match="unknown status field 'colour'"):
        render_jobs(rows, "jobid,colour")


def test_the_json_document_has_a_version() -> None:
    doc = status_document([], job_rows(JOBS, 1000))
    assert doc["version"] == 1
    assert doc["jobs"][0]["state"] == "RUNNING" and doc["jobs"][0]["phase"] == ""
    assert doc["jobs"][0]["account"] == "proj" and doc["jobs"][0]["time_limit_s"] == 5400
    json.dumps(doc)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-j", "1,x"], "'x' is not a job id"),
        (["-j", "١٢"], "is not a job id"),
        (["-t", "SLEEPY"], "unknown job state 'SLEEPY'"),
        (["--phase", "dancing"], "unknown phase 'dancing'"),
        (["-o", "%Z"], "unknown format field %Z"),
        (["-u", "a b"], "is not a name"),
    ],
)
def test_status_usage_errors(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(main, ["status", *args])
    assert result.exit_code == 2 and needle in result.stderr
    assert "Traceback" not in result.stderr


def test_status_h_is_no_header_not_help() -> None:
    result = CliRunner().invoke(main, ["status", "--help"])
    assert "-h, --noheader" in result.output


def test_cancel_selects_by_ids_users_and_names() -> None:
    chosen, errors = select_for_cancel(JOBS, (), ("alice",), ())
    assert [j.job_id for j in chosen] == [11]  # 13 has ended, 14 is not hpcorch's
    chosen, errors = select_for_cancel(JOBS, (), (), ("bert",))
    assert [j.job_id for j in chosen] == [12] and not errors
    chosen, errors = select_for_cancel(JOBS, (11, 12, 13, 14, 99), (), ())
    assert [j.job_id for j in chosen] == [11, 12]
    assert errors == [
        "job 13 already ended (COMPLETED)",
        "job 14 was not submitted by hpcorch",
        "no job 99 in Slurm",
    ]
    chosen, _ = select_for_cancel(JOBS, (11, 12), ("bob",), ())
    assert [j.job_id for j in chosen] == [12]  # ids and filters: both must match


def test_cancel_needs_a_selection() -> None:
    result = CliRunner().invoke(main, ["cancel"])
    assert result.exit_code == 2 and "give JOB_IDS" in result.stderr


LOG = (
    b"early line\n"
    b"hpcorch-run[7]: launch 1: 2 tasks on 1 node(s) x 2, master 127.0.0.1:1\n"
    b"step 1\n"
    b"hpcorch-run[7]: training checkpointed: requeued held for the controller's relaunch\n"
    b"hpcorch-run[7]: launch 2: 4 tasks on 1 node(s) x 4, master 127.0.0.1:2\n"
    b"step 2\n"
)


def test_launches_in_a_jobs_output() -> None:
    assert [ln.number for ln in launches(LOG)] == [1, 2]
    assert launch_slice(LOG, 1).startswith(b"early line\n") and b"step 1" in launch_slice(LOG, 1)
    assert launch_slice(LOG, 2).startswith(b"hpcorch-run[7]: launch 2: 4 tasks")
    assert b"step 1" not in launch_slice(LOG, 2)
    with pytest.raises(ValueError, match=r"no launch 5 .*\(launches: 1, 2\)"):
        launch_slice(LOG, 5)
    assert launches(b"") == []


def test_a_pool_job_between_launches_is_not_over() -> None:
    pool_job = sjob(7, reservation="pool", state="FAILED", exit_code=75)
    assert pooled_job(pool_job) and not is_over(pool_job, True)
    assert is_over(replace(pool_job, exit_code=1), True)
    assert is_over(sjob(7, state="FAILED", exit_code=75), False)  # standalone: over
    assert is_over(None, False) and not is_over(sjob(7), False)


def test_the_job_directory_is_found_by_comment_or_job_json(tmp_path: Path) -> None:
    d = tmp_path / "train-7"
    d.mkdir()
    (d / "job.json").write_text(json.dumps({"slurm_id": 7}))
    assert find_job_dir(7, sjob(7, comment="hpcorch:id=train-7"), tmp_path) == d
    assert find_job_dir(7, None, tmp_path) == d
    assert find_job_dir(8, None, tmp_path) is None


def _run_fnjob(job_dir: Path, fn: object, *args: object, rank: str = "0") -> int:
    (job_dir / fnjob.PAYLOAD_FILE).write_bytes(fnjob.payload(fn, args, {}, []))
    env = {**os.environ, "HPCORCH_JOB_DIR": str(job_dir), "RANK": rank}
    return subprocess.run([sys.executable, fnjob.__file__], env=env, check=False).returncode


def test_the_function_runner_writes_rank_0s_result(tmp_path: Path) -> None:
    assert _run_fnjob(tmp_path, divmod, 17, 5) == 0
    doc = pickle.loads((tmp_path / fnjob.RESULT_FILE).read_bytes())
    assert doc == {"ok": True, "value": (3, 2)}
    (tmp_path / fnjob.RESULT_FILE).unlink()
    assert _run_fnjob(tmp_path, divmod, 1, 0) == 1
    doc = pickle.loads((tmp_path / fnjob.RESULT_FILE).read_bytes())
    assert (
        doc["ok"] is False
        and doc["error"] == "ZeroDivisionError: integer division or modulo by zero"
    )
    assert "Traceback" in doc["tb"]
    (tmp_path / fnjob.RESULT_FILE).unlink()
    assert _run_fnjob(tmp_path, divmod, 17, 5, rank="1") == 0
    assert not (tmp_path / fnjob.RESULT_FILE).exists()  # only rank 0 writes


def test_a_result_read_back_raises_the_remote_error(tmp_path: Path) -> None:
    _run_fnjob(tmp_path, divmod, 1, 0)
    job = Job(7, tmp_path, backend=object())  # type: ignore[arg-type]
    with pytest.raises(JobError, match="job 7 failed: ZeroDivisionError"):
        job.result()


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"min_gpus": 0}, "--min-gpus 0 is out of range"),
        ({"min_gpus": "2"}, "must be a whole number"),
        ({"min_gpus": 1, "acount": "x"}, "unknown option 'acount'"),
        ({"timeout_min": 60}, "unknown option 'timeout_min'; use time"),
        ({"min_gpus": 1, "account": "a b"}, "invalid --account"),
        ({"min_gpus": 1, "sbatch_args": ["--gres=gpu:9"]}, "hpcorch sets --gres itself"),
        ({"min_gpus": 1, "time": "soon"}, "invalid --time"),
        ({"min_gpus": 1, "max_relaunches": "lots"}, "invalid --max-relaunches"),
    ],
)
def test_the_api_checks_options_when_they_are_set(options: dict[str, object], needle: str) -> None:
    """As the CLI does, and at once: at Executor(...) and at update(...), not first at
    submit."""
    with pytest.raises(RequestError, match=needle.replace("(", r"\(")):
        Executor(backend=object(), **options)  # type: ignore[arg-type]
    ex = Executor(backend=object(), min_gpus=1)  # type: ignore[arg-type]
    with pytest.raises(RequestError, match=needle.replace("(", r"\(")):
        ex.update(**options)
    assert ex.options == {"min_gpus": 1}  # a refused update changes nothing


def test_the_api_needs_min_gpus_at_submit_and_takes_the_pool_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ex = Executor(backend=object())  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="min_gpus is required"):
        ex.submit_script(SCRIPT, "--epochs", "1")
    monkeypatch.setenv("HPCORCH_POOL", "gpupool")
    assert request_kwargs({"min_gpus": 1})["pool"] == "gpupool"  # as `submit --pool`
    assert request_kwargs({"min_gpus": 1, "pool": "other"})["pool"] == "other"


def test_a_job_nobody_knows_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoJobs:
        def jobs(self) -> list[object]:
            return []

    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path))
    with pytest.raises(JobError, match="job 999 is known neither to Slurm nor to hpcorch"):
        Job(999, backend=NoJobs())  # type: ignore[arg-type]


def test_submit_after_script_belongs_to_the_script(tmp_path: Path) -> None:
    """`--batch-size 64` after SCRIPT is the script's; hpcorch's options go before."""
    env = {"HPCORCH_HOME": str(tmp_path), "PATH": str(tmp_path / "empty")}
    result = CliRunner(env=env).invoke(
        main, ["submit", "--min-gpus", "1", SCRIPT, "--batch-size", "64", "--min-gpus", "9"]
    )
    # reaches Slurm (absent here) with --min-gpus 1: the later options were not hpcorch's
    assert result.exit_code == 1 and "not found: is Slurm installed" in result.stderr
    result = CliRunner(env=env).invoke(main, ["submit", SCRIPT, "--min-gpus", "2"])
    assert result.exit_code == 2
    assert "--min-gpus after" in result.stderr and "before SCRIPT" in result.stderr


def test_a_bad_percent_field_is_refused() -> None:
    with pytest.raises(FormatError, match="use %"):
        render_jobs([], "%-6j")


def test_every_option_of_every_command_has_help() -> None:
    import click

    from hpcorch.cli import COMMANDS

    ctx = click.Context(main)
    missing = [
        f"{name} {p.opts[0]}"
        for name in COMMANDS
        for p in main.get_command(ctx, name).params  # type: ignore[union-attr]
        if isinstance(p, click.Option) and not p.help and not p.hidden
    ]
    assert missing == []
