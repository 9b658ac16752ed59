"""GPU types end to end on the controller's side, without Slurm: a job's accepted types
from ``submit --gpu-types`` (CLI and API) through its comment, its record and the store,
to what the policy sees, the type a plan's launch requests and what status and report
show."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.cluster import Observation, PoolNode, Shape
from hpcorch.controller.adopt import new_record
from hpcorch.controller.decide import decide
from hpcorch.controller.reconcile import Settings, observe
from hpcorch.controller.reports import digest
from hpcorch.controller.shapes import target_shape
from hpcorch.controller.snapshot import build_snapshot, planned_type, profile_of
from hpcorch.controller.store import SCHEMA_VERSION, JobRecord, Sample, Store
from hpcorch.controller.validate import TagError, parse_tags
from hpcorch.errors import SlurmCommandError, SubmitError
from hpcorch.gputypes import GpuTypeError, parse_gpu_types, parse_tag, type_of_nodes
from hpcorch.policy.types import JobPlan, Plan, Snapshot
from hpcorch.report import build, summary_table
from hpcorch.request import RequestError, build_request
from hpcorch.slurm.backend import shape_args
from hpcorch.slurm.parse import SlurmJob, SlurmNode
from hpcorch.slurm.script import parse_comment, render_batch_script
from hpcorch.status import Managed, job_rows, render_jobs
from hpcorch.submit import build_spec, pool_shape
from tests.test_cli_errors import SCRIPT, error_line
from tests.test_controller_logic import CFG, FakeCluster
from tests.test_controller_loop import Reporting, Scripted, _ctl

# --- the names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("a100", ("a100",)),
        ("a100,h100", ("a100", "h100")),
        (["v100", "A_1.x-2"], ("v100", "A_1.x-2")),
    ],
)
def test_good_type_lists(value: Any, want: tuple[str, ...]) -> None:
    assert parse_gpu_types(value) == want


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("", "is empty"),
        ([], "is empty"),
        ("a100,a100", "given twice"),
        ("a100,", "invalid GPU type ''"),
        ("a 100", "invalid GPU type 'a 100'"),
        ("a100;rm", "invalid GPU type"),
        ("gpu:a100", "invalid GPU type"),
        ("a" * 33, "invalid GPU type"),
        ("h\u00e9", "invalid GPU type"),
        (",".join(f"t{i}" for i in range(17)), "at most 16"),
        ("x," * 100_000, "at most 16"),
        ([1], "invalid GPU type int"),
        (7, "must be a comma list"),
    ],
)
def test_bad_type_lists_are_one_line(value: Any, needle: str) -> None:
    with pytest.raises(GpuTypeError, match=None) as err:
        parse_gpu_types(value)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_type_of_nodes_is_sorted_and_joined() -> None:
    types = {"n1": "v100", "n2": "a100", "n3": ""}
    assert type_of_nodes(["n1", "n2"], types) == "a100+v100"
    assert type_of_nodes(["n2", "n2"], types) == "a100"
    assert type_of_nodes(["n3", "n9"], types) == ""


# --- submission -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("a100,a100", "--gpu-types: GPU type 'a100' is given twice"),
        ("", "--gpu-types is empty"),
        ("a/100", "invalid GPU type 'a/100'"),
        ("a100,h100", "several types need a pool"),
    ],
)
def test_cli_refuses_bad_types_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, needle: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCORCH_POOL", raising=False)
    res = CliRunner().invoke(main, ["submit", "--min-gpus", "1", "--gpu-types", value, SCRIPT])
    assert res.exit_code == 2, res.output
    assert needle in error_line(res.stderr)
    assert len([ln for ln in res.stderr.splitlines() if ln.startswith("Error")]) == 1


def test_the_api_takes_a_list_or_a_comma_string() -> None:
    from hpcorch.apibase import check_options, request_kwargs

    check_options({"gpu_types": ["a100", "h100"], "pool": "p"})
    with pytest.raises(RequestError, match="given twice"):
        check_options({"gpu_types": "a100,a100", "pool": "p"})
    opts = request_kwargs({"min_gpus": 1, "gpu_types": ("a100",)})
    assert build_request(SCRIPT, **opts).gpu_types == ("a100",)


def _node(name: str, kind: str, gpus: int = 4) -> SlurmNode:
    return SlurmNode(name, name, ("IDLE",), ("gpu",), 8, gpus, 0, "", gpu_type=kind)


def test_a_type_the_pool_lacks_is_refused_naming_the_valid_ones() -> None:
    nodes = [_node("n1", "t4"), _node("n2", "a100"), _node("n3", "a100", 2)]
    shape = pool_shape(nodes, "gpu", None, ("a100",), "hp")
    assert (shape.nodes, shape.gpus_per_node) == (2, 2)  # its type's nodes only
    with pytest.raises(SubmitError, match=r"pool 'hp' has no GPU type h100 \(valid: a100, t4\)"):
        pool_shape(nodes, "gpu", None, ("a100", "h100"), "hp")
    with pytest.raises(SubmitError, match="valid: none: its GPUs are untyped"):
        pool_shape([_node("n1", "")], "gpu", None, ("a100",))


def test_the_comment_carries_the_types_and_a_job_outside_a_pool_asks_for_its_type(
    tmp_path: Path,
) -> None:
    nodes = [_node("n1", "t4"), _node("n2", "a100")]
    req = build_request(SCRIPT, min_gpus=2, gpu_types="a100,t4", pool="hp")
    spec = build_spec(req, pool_shape(nodes, "gpu", None, req.gpu_types), "k", tmp_path)
    text = render_batch_script(spec)
    line = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --comment="))
    assert parse_comment(line.split("=", 1)[1])["types"] == "a100+t4"  # type: ignore[index]
    assert "#SBATCH --gres=gpu:2" in text  # in a pool, the controller requests the type
    one = build_request(SCRIPT, min_gpus=2, gpu_types="a100")
    text = render_batch_script(
        build_spec(one, pool_shape(nodes, "gpu", None, ("a100",)), "k", tmp_path)
    )
    assert "#SBATCH --gres=gpu:a100:2" in text


# --- the controller reads them --------------------------------------------------------


def test_the_types_tag_is_checked_like_the_others() -> None:
    assert parse_tags({"types": "a100+h100"}).gpu_types == ("a100", "h100")
    assert parse_tags({}).gpu_types == ()
    for bad in ("a100+a100", "", "a 100", "+".join(["t"] * 40), "x" * 10_000):
        with pytest.raises(TagError):
            parse_tags({"types": bad})
    assert parse_tag("v100") == ("v100",)


def _job(tags: dict[str, str], **kw: Any) -> Any:
    c = FakeCluster()
    c.add(1, 1, 4)
    c.set(1, tags={**c.jobs[1].job.tags, **tags}, **kw)
    return c.jobs[1].job


def test_a_job_with_a_bad_types_tag_is_refused_not_lost() -> None:
    rec = new_record(_job({"types": "a100+a100"}), 5.0)
    assert rec.phase == "refused" and "given twice" in rec.reason
    rec = new_record(_job({"types": "a100+h100"}), 5.0)
    assert rec.phase == "queued" and rec.gpu_types == "a100,h100"
    assert rec.accepted_types() == ("a100", "h100")


def test_an_old_store_migrates_to_schema_9(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = Store(path)
    store.put_job(JobRecord(3, "k", "n", "u", "/d", "a", 1, 2, 64, 64, 64, 0.0, "queued", 0.0))
    store.add_samples([Sample(3, 1.0, 2, 1, 32, 1, 64, 0.5, 128.0)])
    store.close()
    db = sqlite3.connect(path)
    for name in ("gpu_types", "gpu_type", "target_type"):
        db.execute(f"ALTER TABLE jobs DROP COLUMN {name}")
    db.execute("ALTER TABLE samples DROP COLUMN gpu_type")
    db.execute("UPDATE meta SET value='8' WHERE key='schema'")
    db.commit()
    db.close()
    old = Store(path, readonly=True)  # a reader does not migrate: defaults
    rec = old.job(3)
    assert rec is not None and (rec.gpu_types, rec.gpu_type, rec.target_type) == ("", "", "")
    assert old.samples(3)[0].gpu_type == ""
    old.close()
    store = Store(path)
    assert store.get_meta("schema") == str(SCHEMA_VERSION) == "11"
    rec = store.job(3)
    assert rec is not None and rec.gpu_type == ""
    store.put_job(replace(rec, gpu_types="a100", gpu_type="a100", target_type="a100"))
    store.add_samples([Sample(3, 2.0, 2, 1, 32, 1, 64, 0.5, 128.0, gpu_type="a100")])
    again = store.job(3)
    assert again is not None and (again.gpu_types, again.gpu_type, again.target_type) == (
        "a100",
        "a100",
        "a100",
    )
    assert [s.gpu_type for s in store.samples(3)] == ["", "a100"]


def _pool(*kinds: str) -> tuple[PoolNode, ...]:
    return tuple(PoolNode(f"n{i + 1}", 4, 0, True, gpu_type=k) for i, k in enumerate(kinds))


def _rec(**kw: Any) -> JobRecord:
    base = JobRecord(7, "k", "n", "u", "/d", "a", 1, 8, 64, 64, 64, 0.0, "queued", 0.0)
    return replace(base, **kw)


def test_the_snapshot_shows_node_types_and_each_jobs_types() -> None:
    running = _rec(
        phase="running", gpus=4, nodes=1, node_list="n2", gpu_type="a100", gpu_types="a100"
    )
    queued = replace(_rec(), slurm_id=8)
    snap = build_snapshot(0.0, _pool("t4", "a100"), [running, queued], {}, (), {}, 60.0, 30.0)
    assert snap.node_types == ("t4", "a100") and snap.gpu_types == ("a100", "t4")
    assert not snap.mix_types
    views = {v.job_id: v for v in snap.jobs}
    assert (views["7"].gpu_type, views["7"].gpu_types) == ("a100", ("a100",))
    assert (views["8"].gpu_type, views["8"].gpu_types) == ("", ())
    # a node of no known type: types are not planned
    snap = build_snapshot(0.0, _pool("t4", ""), [queued], {}, (), {}, 60.0, 30.0, mix_types=True)
    assert snap.node_types == () and snap.mix_types
    # one type: known, but nothing to choose
    snap = build_snapshot(0.0, _pool("a100", "a100"), [running], {}, (), {}, 60.0, 30.0)
    assert snap.node_types == ("a100", "a100") and snap.gpu_types == ()
    assert snap.jobs[0].gpu_type == ""


def test_a_profile_keeps_each_type_apart() -> None:
    samples = [
        Sample(7, float(t), 4, 1, 16, 1, 64, step, 100.0, gpu_type=kind)
        for t, (step, kind) in enumerate([(0.5, "t4"), (0.2, "a100"), (0.5, "t4")])
    ]
    prof = profile_of(samples)
    assert sorted((p.gpu_type, p.step_time) for p in prof) == [("a100", 0.2), ("t4", 0.5)]


def test_a_plan_without_a_type_requests_its_nodes_type() -> None:
    snap = build_snapshot(0.0, _pool("t4", "a100"), [_rec()], {}, (), {}, 60.0, 30.0)
    assert planned_type(snap, JobPlan("7", 4, {1: 4}, 64, 16, 1)) == "a100"
    assert planned_type(snap, JobPlan("7", 4, {1: 4}, 64, 16, 1, gpu_type="x")) == "x"
    assert planned_type(snap, None) == ""
    one = build_snapshot(0.0, _pool("a100", "a100"), [_rec()], {}, (), {}, 60.0, 30.0)
    assert planned_type(one, JobPlan("7", 4, {1: 4}, 64, 16, 1)) == ""


def test_decide_keeps_the_type_and_the_launch_requests_it() -> None:
    rec = _rec()
    out = decide(rec, 4, {1: 4}, 10.0, ("n1", "n2"), Settings(), gpu_type="a100")
    assert rec.target_type == "a100" and rec.phase == "starting"
    (start,) = out.actions
    assert start.shape == Shape(1, 4, ("n2",), 0, (4,), "a100")
    assert target_shape(replace(rec, target_placement="{}"), ()).gpu_type == "a100"


def test_a_move_to_another_type_at_the_same_count_restarts_the_job() -> None:
    # a type-aware plan that keeps a job's GPU count but gives it another type is a resize:
    # the job is signalled and relaunches on the planned type (it was dropped as no change)
    s = Settings()
    rec = _rec(phase="running", gpus=4, nodes=1, node_list="n1", gpu_type="t4", ready=1)
    out = decide(rec, 4, {1: 4}, 1000.0, ("n1", "n2"), s, gpu_type="a100", chose_type=True)
    (signal,) = out.actions
    assert signal.kind == "signal" and rec.phase == "stopping"
    assert (rec.target_gpus, rec.target_type) == (4, "a100")
    assert out.events == ["resize: 4 GPUs of t4 -> 4 GPUs of a100"]
    # the same type, a plan that names none ("any"), or a type-blind policy's placement on
    # other nodes at the same count, is no change
    for kind, chose in (("t4", True), ("", True), ("a100", False)):
        rec = _rec(phase="running", gpus=4, nodes=1, node_list="n1", gpu_type="t4", ready=1)
        out = decide(rec, 4, {1: 4}, 1000.0, ("n1", "n2"), s, gpu_type=kind, chose_type=chose)
        assert out.actions == []
    # a live batch change never stands in for a move
    rec = _rec(phase="running", gpus=4, nodes=1, node_list="n1", gpu_type="t4", ready=1,
               target_batch=256, batch=64)  # fmt: skip
    out = decide(rec, 4, {1: 4}, 1000.0, ("n1", "n2"), s, live_batch=True,
                 gpu_type="a100", chose_type=True)  # fmt: skip
    assert [a.kind for a in out.actions] == ["signal"]


def test_observe_reads_the_type_off_the_nodes_slurm_shows() -> None:
    rec = _rec(phase="starting", target_gpus=4, target_type="a100")
    job = _job({}, state="RUNNING", held=False, node_names=("n2",), gpus_per_node=4)
    observe(rec, job, 10.0, ("n1", "n2"), Settings(), {"n1": "t4", "n2": "a100"})
    assert (rec.phase, rec.gpu_type) == ("running", "a100")
    # Slurm is the truth: a launch it put elsewhere is shown where it runs
    job = replace(job, node_names=("n1", "n2"))
    observe(rec, job, 11.0, ("n1", "n2"), Settings(), {"n1": "t4", "n2": "a100"})
    assert rec.gpu_type == "a100+t4"


def test_a_sample_records_the_type_of_its_launch() -> None:
    rec = _rec(phase="running", gpus=4, nodes=1, node_list="n2", gpu_type="a100", ready=1)
    line = {"event": "steps", "time": 5.0, "step": 10, "step_time": 0.1, "gpus": 4,
            "global_batch": 64, "per_gpu_batch": 16, "samples_per_s": 640.0}  # fmt: skip
    sample = digest(rec, line, lambda m: None)
    assert sample is not None and sample.gpu_type == "a100"


# --- the loop: a plan's launch requests its type ------------------------------------------


class Typed(Reporting):
    """The fake cluster with typed nodes: n1 t4, n2 a100."""

    def observe(self) -> Observation:
        obs = super().observe()
        kinds = ("t4", "a100")
        return replace(
            obs, nodes=tuple(replace(n, gpu_type=kinds[i]) for i, n in enumerate(obs.nodes))
        )


def test_the_loop_starts_a_typed_plan_with_its_type(tmp_path: Path) -> None:
    c = Typed()
    c.add(1, 1, 8)
    c.set(1, tags={**c.jobs[1].job.tags, "types": "a100"})
    policy = Scripted({"1": (4, {1: 4}, 64)})
    ctl = _ctl(tmp_path, c, policy)
    ctl.cycle()
    assert c.shapes[-1] == Shape(1, 4, ("n2",), 0, (4,), "a100")
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and (rec.phase, rec.gpu_type, rec.target_type) == (
        "running",
        "a100",
        "a100",
    )
    (view,) = policy.seen[-1].jobs
    assert (view.gpu_type, view.gpu_types) == ("a100", ("a100",))


class TypeChoosing(Scripted):
    """A type-aware policy: its plans name their type (the type of their nodes)."""

    def schedule(self, snapshot: Snapshot) -> Plan:
        plan = super().schedule(snapshot)
        return Plan(tuple(replace(p, gpu_type=snapshot.type_of(p.placement)) for p in plan.jobs))


def test_the_loop_moves_a_job_to_the_type_its_policy_chose(tmp_path: Path) -> None:
    for policy, moves in ((TypeChoosing({"1": (4, {0: 4}, 64)}), True),
                          (Scripted({"1": (4, {0: 4}, 64)}), False)):  # fmt: skip
        c = Typed()
        c.add(1, 1, 8)
        ctl = _ctl(tmp_path / policy.name / str(moves), c, policy, restart_cost_s=0.0)
        ctl.cycle()
        c.t += 5
        ctl.cycle()
        rec = ctl.store.job(1)
        assert rec is not None and (rec.phase, rec.gpu_type) == ("running", "t4")
        policy.plans["1"] = (4, {1: 4}, 64)  # the same count, on the a100 node
        c.t += 120
        ctl.cycle()
        # a type-aware plan moves it (a restart on a100); a type-blind one's placement on
        # other nodes at the same count is no change
        assert (("signal", 1) in c.log) is moves
        if moves:
            ctl.cycle()
            c.t += 5
            ctl.cycle()
            assert c.shapes[-1] == Shape(1, 4, ("n2",), 0, (4,), "a100")


def test_a_plan_across_types_is_refused_unless_the_site_mixes(tmp_path: Path) -> None:
    c = Typed()
    c.add(1, 1, 8)
    ctl = _ctl(tmp_path, c, Scripted({"1": (8, {0: 4, 1: 4}, 64)}))
    ctl.cycle()
    assert not c.shapes  # the plan spans t4 and a100: ignored, nothing started
    c2 = Typed()
    c2.add(1, 1, 8)
    ctl2 = _ctl(tmp_path / "mix", c2, Scripted({"1": (8, {0: 4, 1: 4}, 64)}), mix_types=True)
    ctl2.cycle()
    # across types, the launch asks for any GPUs on exactly its nodes
    assert c2.shapes[-1] == Shape(2, 4, ("n1", "n2"), 0, (4, 4), "")
    ctl2.cycle()
    rec = ctl2.store.job(1)
    assert rec is not None and rec.gpu_type == "a100+t4"


def test_shape_args_ask_for_the_type() -> None:
    assert "TresPerNode=gres:gpu:a100:4" in shape_args(1, 4, ["n2"], gpu_type="a100")
    uneven = shape_args(2, 4, ["n1", "n2"], per_node=[4, 2], gpu_type="v100")
    assert "TresPerJob=gres:gpu:v100:6" in uneven
    assert "TresPerNode=gres:gpu:4" in shape_args(1, 4)  # untyped: any GPU, a type cleared
    with pytest.raises(ValueError):
        shape_args(1, 4, gpu_type="a100,b")


# --- what users see -------------------------------------------------------------------


def _slurm_job(job_id: int, state: str, nodes: str, comment: str) -> SlurmJob:
    return SlurmJob(
        job_id, "j", "alice", state, "None", "gpu", nodes, 1, 4, comment,
        0, 50 if nodes else 0, 0, 60, 0, 0, "/", "hp", False,
    )  # fmt: skip


def test_status_shows_the_type_where_types_are_in_play() -> None:
    jobs = [
        _slurm_job(1, "RUNNING", "n2", "hpcorch:id=a,min=1,max=4,types=a100"),
        _slurm_job(2, "PENDING", "", "hpcorch:id=b,min=1,max=4,types=a100+t4"),
        _slurm_job(3, "PENDING", "", "hpcorch:id=c,min=1,max=4"),
        _slurm_job(4, "RUNNING", "n1", "hpcorch:id=d,min=1,max=4,types=bad+bad"),
    ]
    managed = {1: Managed("running", "launch 1", 64, 16, 1, 0.0, 1, gpu_type="a100")}
    rows = job_rows(jobs, 100, managed=managed, node_types={"n1": "t4", "n2": "a100"})
    assert [r.type_text() for r in rows] == ["a100", "a100|t4", "any", "t4"]
    text = render_jobs(rows)
    assert text.splitlines()[0].split()[6:8] == ["GPUS", "TYPE"]
    plain = job_rows(jobs[2:3], 100)
    assert "TYPE" not in render_jobs(plain)


def _report_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    job = {"slurm_id": 1, "name": "A", "mode": "managed", "phase": "done", "submit_time": 0.0,
           "finished_at": 100.0, "started_at": 1.0, "gpu_seconds": 400.0, "resizes": 1,
           "phase_since": 100.0, "launches": 2, "gpu_type": "a100"}  # fmt: skip
    dec = [
        {"slurm_id": 1, "action": "start", "status": "done", "time": 1.0, "done_at": 1.0,
         "from_gpus": 0, "to_gpus": 4, "detail": "start at 4 GPUs"},
        {"slurm_id": 1, "action": "start", "status": "done", "time": 50.0, "done_at": 50.0,
         "from_gpus": 0, "to_gpus": 4, "detail": "start at 4 GPUs"},
    ]  # fmt: skip
    sams = [
        {"slurm_id": 1, "time": t, "global_batch": 64, "step": int(t), "step_time": 0.1,
         "loss": None, "gpu_type": kind}
        for t, kind in ((10.0, "t4"), (20.0, "t4"), (60.0, "a100"))
    ]  # fmt: skip
    return [job], dec, sams


def test_report_shows_the_types_a_job_ran_on() -> None:
    jobs, dec, sams = _report_rows()
    rep = build(jobs, dec, sams, {}, "x")
    (a,) = rep.jobs
    assert a.gpu_types == ["t4", "a100"]
    assert [s.gpu_type for s in a.segments] == ["t4", "a100"]
    headers, rows = summary_table(rep)
    assert headers[-1] == "GPU_TYPES" and rows[0][-1] == "t4,a100"
    again = type(rep).from_json(json.loads(json.dumps(rep.to_json())))
    assert again.jobs[0].gpu_types == ["t4", "a100"]
    for s in sams:
        s["gpu_type"] = ""
    jobs[0]["gpu_type"] = ""
    assert summary_table(build(jobs, dec, sams, {}, "x"))[0][-1] == "FINAL_LOSS"


def test_controller_has_the_mix_option() -> None:
    res = CliRunner().invoke(main, ["controller", "--help"])
    assert "--mix-gpu-types" in res.output
    assert CFG.mix_types is False


def test_a_request_that_changes_between_typed_and_untyped_is_cleared_first() -> None:
    """slurmctld refuses an update from gres:gpu:2 to gres:gpu:a100:2 in one go (22.05 to
    25.11: "with and without type identification"); cleared first, it takes it."""
    from tests.test_slurm_backends import RecordingCLI

    class Refusing(RecordingCLI):
        def run(self, argv: Any, stdin: str | None = None) -> str:
            if "TresPerNode=gres:gpu:a100:2" in argv and len(self.argv) == 0:
                self.argv.append(list(argv))
                raise SlurmCommandError(
                    "scontrol failed: Invalid GRES specification (with and without type "
                    "identification) for job 12"
                )
            return super().run(argv, stdin)

    cli = Refusing()
    cli.set_shape(12, 1, 2, ["n3"], gpu_type="a100")
    assert [a[3:] for a in cli.argv] == [
        ["NumNodes=1-1", "TresPerJob=", "TresPerNode=gres:gpu:a100:2", "ReqNodeList=n3"],
        ["TresPerNode=", "TresPerJob="],
        ["NumNodes=1-1", "TresPerJob=", "TresPerNode=gres:gpu:a100:2", "ReqNodeList=n3"],
    ]
    other = RecordingCLI()
    other.fail["update"] = "Invalid job id specified"
    with pytest.raises(SlurmCommandError):
        other.set_shape(12, 1, 2, gpu_type="a100")
    assert len(other.argv) == 1
