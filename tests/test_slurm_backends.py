"""The two Slurm backends behind one interface.

SlurmCLI: the exact command lines of its job and reservation actions (commands are
recorded, not run; the integration tests run them against real Slurm). make_backend():
which backend the environment selects, and its error. PySlurmBackend: pure mapping logic
only, against a small fake ``pyslurm`` module injected through sys.modules, written from
pyslurm 25.11's documented API; no real pyslurm or Slurm 25.11 is involved.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.cluster import Shape
from hpcorch.errors import HpcorchError, SlurmCommandError, SlurmUnavailable
from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.cluster import SlurmCluster
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.parse import SlurmJob, SlurmNode
from hpcorch.slurm.pyslurm_backend import PySlurmBackend, submit_options
from tests.squeue_text import signatures

GOLDEN = Path(__file__).parent / "golden" / "batch_script.sbatch"


class RecordingCLI(SlurmCLI):
    def __init__(self, answers: dict[tuple[str, ...], str] | None = None) -> None:
        super().__init__()
        self.argv: list[list[str]] = []
        self.answers = answers or {}
        self.fail: dict[str, str] = {}

    def run(self, argv: Sequence[str], stdin: str | None = None) -> str:
        self.calls += 1
        self.argv.append(list(argv))
        if argv[1] in self.fail:
            raise SlurmCommandError(f"scontrol failed: {self.fail[argv[1]]}")
        return self.answers.get(tuple(argv), "")


def test_cli_actions_are_the_scontrol_commands() -> None:
    cli = RecordingCLI()
    cli.set_shape(12, 2, 4, ["n1", "n2"])
    cli.set_shape(12, 1, 2)
    cli.set_shape(12, 2, 4, ["n3", "n1"], cpus_per_gpu=2, per_node=[4, 2])
    cli.set_shape(12, 2, 2, ["n1", "n2"], cpus_per_gpu=3, per_node=[2, 2])
    cli.start_now(12)
    cli.set_comment(12, "hpcorch:id=a b,min=1")
    cli.hold(12)
    cli.release(12)
    cli.requeue_hold(12)
    cli.create_reservation("pool", "n[1-4]", "alice", "gpu")
    cli.cancel(12, signal="USR2", batch_only=True)
    assert cli.argv == [
        ["scontrol", "update", "jobid=12", "NumNodes=2-2", "TresPerJob=",
         "TresPerNode=gres:gpu:4", "ReqNodeList=n1,n2"],
        ["scontrol", "update", "jobid=12", "NumNodes=1-1", "TresPerJob=",
         "TresPerNode=gres:gpu:2", "ReqNodeList="],
        # uneven: one GPU count for the job on exactly these nodes; its CPUs spread evenly,
        # the leanest node's (2 GPUs x 2) on each
        ["scontrol", "update", "jobid=12", "NumNodes=2-2", "TresPerNode=",
         "TresPerJob=gres:gpu:6", "MinCPUsNode=4", "NumCPUs=8", "ReqNodeList=n3,n1"],
        ["scontrol", "update", "jobid=12", "NumNodes=2-2", "TresPerJob=",
         "TresPerNode=gres:gpu:2", "MinCPUsNode=6", "NumCPUs=12", "ReqNodeList=n1,n2"],
        ["scontrol", "update", "jobid=12", "StartTime=now"],
        ["scontrol", "update", "jobid=12", "Comment=hpcorch:id=a b,min=1"],
        ["scontrol", "hold", "12"],
        ["scontrol", "release", "12"],
        ["scontrol", "requeuehold", "12"],
        ["scontrol", "create", "reservation", "ReservationName=pool", "Nodes=n[1-4]",
         "Users=alice", "StartTime=now", "Duration=3650-00:00:00", "Flags=IGNORE_JOBS",
         "PartitionName=gpu"],
        ["scancel", "--signal=USR2", "--batch", "12"],
    ]  # fmt: skip


def test_cli_reservation_nodes() -> None:
    cli = RecordingCLI(
        {
            ("scontrol", "-o", "show", "reservation", "pool"): (
                "ReservationName=pool StartTime=2026-01-01T00:00:00 EndTime=2036-01-01T00:00:00 "
                "Duration=3652-00:00:00 Nodes=gpu-a[001-002],c196-011 NodeCnt=3 "
                "Flags=IGNORE_JOBS,SPEC_NODES Users=hpcorch"
            ),
            ("scontrol", "-o", "show", "reservation", "empty"): (
                "ReservationName=empty Nodes=(null) EndTime=Unknown"
            ),
        }
    )
    assert cli.reservation_nodes("pool") == ["gpu-a001", "gpu-a002", "c196-011"]
    res = cli.reservation("pool")
    assert res.flags == ("IGNORE_JOBS", "SPEC_NODES") and res.users == "hpcorch"
    assert res.end_time == time.mktime((2036, 1, 1, 0, 0, 0, 0, 0, -1))
    assert cli.reservation_nodes("empty") == [] and cli.reservation("empty").end_time == 0
    with pytest.raises(SlurmCommandError, match="not found"):
        cli.reservation("other")
    assert cli.calls == 5  # one scontrol call each: hostlists are expanded in-process


def _pool(end: float) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))
    return f"ReservationName=pool EndTime={stamp} Nodes=n[1-2] Flags=IGNORE_JOBS"


class ReservationCLI(RecordingCLI):
    """A reservation whose end moves when it is extended (unless the update fails)."""

    def __init__(self, end: float) -> None:
        empty = {
            ("squeue", "--json", "--states=all"): '{"jobs": []}',
            ("sinfo", "--json"): '{"nodes": []}',
        }
        super().__init__(empty)
        self.end = end

    def run(self, argv: Sequence[str], stdin: str | None = None) -> str:
        out = super().run(argv, stdin)
        if list(argv[:3]) == ["scontrol", "update", "ReservationName=pool"]:
            self.end = time.mktime(time.strptime(argv[3].split("=")[1], "%Y-%m-%dT%H:%M:%S"))
        return _pool(self.end) if "show" in argv else out


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def ctl_log() -> Iterator[_Records]:
    """The controller's log records (hpcorch's logger may not propagate to pytest's)."""
    logger = logging.getLogger("hpcorch.controller")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_the_reservation_is_extended_before_it_ends(ctl_log: _Records) -> None:
    now = time.time()
    cli = ReservationCLI(now + 10 * 86400)
    cluster = SlurmCluster("pool", backend=cli)
    assert cluster.reservation_nodes(refresh=True) == ("n1", "n2")
    assert cli.argv[1][:3] == ["scontrol", "update", "ReservationName=pool"]
    assert cluster.pool_ends_at == pytest.approx(now + 3650 * 86400, abs=5)
    assert cluster.observe().pool_ends_at == cluster.pool_ends_at
    assert any("extended to" in r.getMessage() for r in ctl_log.records)
    # far from its end: read, not touched
    cli.argv.clear()
    cluster.reservation_nodes(refresh=True)
    assert [a[:2] for a in cli.argv] == [["scontrol", "-o"], ["sshare", "-a"]]  # no update


def test_a_reservation_that_cannot_be_extended_is_a_warning_each_hour(ctl_log: _Records) -> None:
    now = time.time()
    cli = ReservationCLI(now + 2 * 86400)
    cli.fail["update"] = "Access/permission denied"
    cluster = SlurmCluster("pool", backend=cli)
    cluster.reservation_nodes(refresh=True)
    cluster.reservation_nodes(refresh=True)  # within the hour: no second warning
    warnings = [r.getMessage() for r in ctl_log.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "ends " in warnings[0] and "could not be extended" in warnings[0]
    assert "permission denied" in warnings[0] and "(in 2.0 days)" in warnings[0]
    assert cluster.pool_ends_at == pytest.approx(now + 2 * 86400, abs=2)


def test_cluster_start_tolerates_a_job_not_held() -> None:
    cli = RecordingCLI({("scontrol", "-o", "show", "reservation", "pool"): "Nodes=n1"})
    cli.fail["release"] = "Job is not held"
    cluster = SlurmCluster("pool", backend=cli)
    cluster.start(5, Shape(nodes=1, gpus_per_node=2, node_names=("n1",)))
    assert cluster.flush() == {}
    # the shape and StartTime=now in one update; the list, then the job on its own
    assert [a[1] for a in cli.argv] == ["update", "release", "release"]
    assert cli.argv[0][-1] == "StartTime=now"
    cli.fail["release"] = "Invalid job id specified"
    cluster.start(5, Shape(nodes=1, gpus_per_node=2, node_names=("n1",)))
    assert cluster.flush() == {5: "scontrol failed: Invalid job id specified"}


class RefusingCLI(RecordingCLI):
    """scontrol as it answers a list of job ids of which some are refused: it tries each,
    says which failed, and exits 1."""

    def __init__(self, refused: dict[int, str]) -> None:
        super().__init__({("scontrol", "-o", "show", "reservation", "pool"): "Nodes=n1,n2"})
        self.refused = refused

    def run(self, argv: Sequence[str], stdin: str | None = None) -> str:
        out = super().run(argv, stdin)
        if argv[1] in ("hold", "release"):
            ids = [int(j) for j in argv[2].split(",")]
            errors = [f"{self.refused[j]} for job {j}" for j in ids if j in self.refused]
            if errors:
                raise SlurmCommandError(f"scontrol failed: {errors[0]}")
        return out


def test_a_cycles_holds_and_releases_go_to_slurm_together() -> None:
    cli = RefusingCLI({})
    cluster = SlurmCluster("pool", backend=cli)
    for job in (7, 8, 9):
        cluster.start(job, Shape(nodes=1, gpus_per_node=2, node_names=("n1",)))
    cluster.hold(10)
    cluster.hold(11)
    assert cluster.flush() == {}
    assert [a[1:] for a in cli.argv if a[1] != "update"] == [
        ["hold", "10,11"],
        ["release", "7,8,9"],
    ]
    assert sum(a[1] == "update" for a in cli.argv) == 3  # one per start
    cli.argv.clear()
    assert cluster.flush() == {} and cli.argv == []  # nothing left over
    cluster.start(12, Shape(nodes=1, gpus_per_node=2, node_names=("n1",)))
    assert cluster.flush(send=False) == {} and [a[1] for a in cli.argv] == ["update"]
    cli.argv.clear()
    assert cluster.flush() == {} and cli.argv == []  # dropped, not sent a cycle late


def test_a_refused_job_in_the_list_is_found_and_the_others_are_released() -> None:
    cli = RefusingCLI({8: "Invalid job id specified"})
    cluster = SlurmCluster("pool", backend=cli)
    for job in (7, 8, 9):
        cluster.start(job, Shape(nodes=1, gpus_per_node=2, node_names=("n1",)))
    assert cluster.flush() == {8: "scontrol failed: Invalid job id specified for job 8"}
    releases = [a[2] for a in cli.argv if a[1] == "release"]
    assert releases == ["7,8,9", "7", "8", "9"]


# --- make_backend --------------------------------------------------------------------


class FakeJob:
    """Attributes as pyslurm 25.11's ``pyslurm.Job`` documents them."""

    def __init__(self, job_id: int, log: list[tuple[Any, ...]] | None = None, **kw: Any) -> None:
        self.id = job_id
        self.log = log if log is not None else []
        defaults: dict[str, Any] = dict(
            name="train",
            user_name="alice",
            user_id=1000,
            state="RUNNING",
            state_reason="None",
            partition="gpu",
            allocated_nodes="n[1-2]",
            num_nodes=2,
            gres_per_node={"gpu": 4},
            comment="hpcorch:id=x,min=4,max=8",
            submit_time=1700000000,
            start_time=1700000010,
            end_time=1700003610,
            time_limit=60,
            requeue_count=1,
            exit_code=0,
            exit_code_signal=0,
            working_directory="/home/alice",
            reservation="pool",
            priority=4294901756,
            cpus=8,
            cpus_per_task=1,  # None when the job asked CPUs per GPU (see job 9)
            cpus_per_gpu=None,  # pyslurm 25.11 answers None for every real job
            layout={},
        )
        defaults.update(kw)
        self.__dict__.update(defaults)

    def get_resource_layout_per_node(self) -> dict[str, Any]:
        return dict(self.layout)

    def send_signal(self, signal: Any, steps: str = "children", hurry: bool = False) -> None:
        self.log.append(("send_signal", self.id, signal, steps))

    def cancel(self) -> None:
        self.log.append(("cancel", self.id))

    def modify(self, changes: Any) -> None:
        self.log.append(("modify", self.id, changes.kw))

    def hold(self, mode: str | None = None) -> None:
        self.log.append(("hold", self.id))

    def release(self) -> None:
        self.log.append(("release", self.id))

    def requeue(self, hold: bool = False) -> None:
        self.log.append(("requeue", self.id, hold))


class Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def fake_pyslurm(version: str = "25.11.0") -> types.ModuleType:
    mod = types.ModuleType("pyslurm")
    log: list[tuple[Any, ...]] = []
    jobs = {
        7: FakeJob(7, log),
        8: FakeJob(
            8,
            log,
            state="REQUEUE_HOLD",
            state_reason="JobHeldUser",
            allocated_nodes=None,
            num_nodes=1,
            gres_per_node={"gpu:a100": 2},
            priority=0,
            exit_code=0,
            exit_code_signal=15,
            time_limit=None,
        ),
        9: FakeJob(  # as pyslurm 25.11 gives a job of --gres=gpu:2 --cpus-per-gpu=3 on n1
            9,
            log,
            allocated_nodes="n1",
            num_nodes=1,
            gres_per_node={"gres/gpu": 2},  # Slurm's "gres/" prefix is kept
            cpus=6,
            cpus_per_task=None,
            reservation="other",
            layout={
                "n1": {
                    "cpu_ids": "0-5",
                    "gres": {"gpu": {"count": 2, "indexes": "0-1"}},
                    "memory": None,
                }
            },
        ),
        10: FakeJob(  # ended: its layout is no GPU in use
            10,
            log,
            state="FAILED",
            allocated_nodes="n1",
            num_nodes=1,
            exit_code=75,
            layout={"n1": {"cpu_ids": "0", "gres": {"gpu": {"count": 4}}, "memory": None}},
        ),
    }
    nodes = {
        "n1": Obj(
            name="n1",
            address="10.0.0.1",
            state="MIXED",
            partitions=["gpu"],
            total_cpus=64,
            configured_gres={"gpu:a100": 4},
            allocated_gres={},  # empty unless AccountingStorageTRES names gres/gpu
            allocated_cpus=6,
            reason=None,
        ),
        "n2": Obj(
            name="n2",
            address="10.0.0.2",
            state="IDLE+DRAIN",
            partitions=["gpu", "debug"],
            total_cpus=64,
            configured_gres={"gpu": 4},
            allocated_gres={},
            allocated_cpus=0,
            reason="bad gpu",
        ),
    }

    class RPCError(Exception):
        pass

    class JobSubmitDescription:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

        def submit(self) -> int:
            log.append(("submit", self.kw))
            return 99

    class Collection:
        def __init__(self, items: dict[Any, Any]) -> None:
            self.items = items

        def values(self) -> Any:
            return self.items.values()

    class MissingJob(FakeJob):
        def release(self) -> None:
            raise RPCError("Invalid job id specified")

    def job_factory(job_id: int) -> FakeJob:  # pyslurm.Job(id) makes no RPC
        return MissingJob(job_id, log) if job_id == 404 else FakeJob(job_id, log)

    mod.__version__ = version  # type: ignore[attr-defined]
    mod.RPCError = RPCError  # type: ignore[attr-defined]
    mod.JobSubmitDescription = JobSubmitDescription  # type: ignore[attr-defined]
    mod.Job = job_factory  # type: ignore[attr-defined]
    mod.Jobs = Obj(load=lambda: Collection(jobs))  # type: ignore[attr-defined]
    mod.Nodes = Obj(load=lambda: Collection(nodes))  # type: ignore[attr-defined]
    mod.Partitions = Obj(  # type: ignore[attr-defined]
        load=lambda: Collection(
            {"gpu": Obj(name="gpu", is_default=True), "debug": Obj(name="debug")}
        )
    )
    mod.Reservations = Obj(  # type: ignore[attr-defined]
        load=lambda: Collection({"pool": Obj(name="pool", nodes="n[1-2]")})
    )
    mod.log = log  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def pyslurm_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    mod = fake_pyslurm()
    monkeypatch.setitem(sys.modules, "pyslurm", mod)
    monkeypatch.delenv("HPCORCH_SLURM_BACKEND", raising=False)
    yield mod


def test_make_backend_without_pyslurm_is_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import fails
    assert isinstance(make_backend({}), SlurmCLI)
    assert isinstance(make_backend({"HPCORCH_SLURM_BACKEND": "cli"}), SlurmCLI)
    with pytest.raises(HpcorchError) as err:
        make_backend({"HPCORCH_SLURM_BACKEND": "pyslurm"})
    msg = str(err.value)
    assert "pyslurm cannot be imported" in msg and "valid: cli, pyslurm" in msg
    assert "\n" not in msg
    with pytest.raises(HpcorchError, match=r"'slurmrestd' is not a Slurm backend \(valid"):
        make_backend({"HPCORCH_SLURM_BACKEND": "slurmrestd"})


def test_make_backend_picks_pyslurm_when_it_imports(pyslurm_module: types.ModuleType) -> None:
    assert isinstance(make_backend({}), PySlurmBackend)
    assert isinstance(make_backend({"HPCORCH_SLURM_BACKEND": "pyslurm"}), PySlurmBackend)
    assert isinstance(make_backend({"HPCORCH_SLURM_BACKEND": "cli"}), SlurmCLI)


def test_make_backend_refuses_an_old_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("24.5.1"))
    assert isinstance(make_backend({}), SlurmCLI)
    with pytest.raises(HpcorchError, match=r"pyslurm 24\.5\.1 is older than 25\.11"):
        make_backend({"HPCORCH_SLURM_BACKEND": "pyslurm"})


def test_cli_reports_a_bad_backend_choice_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)
    monkeypatch.setenv("HPCORCH_SLURM_BACKEND", "pyslurm")
    for args in (["status"], ["cancel", "3"], ["resize", "3", "--gpus", "2"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.stderr
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "HPCORCH_SLURM_BACKEND=pyslurm" in lines[0], lines


# --- PySlurmBackend mapping ----------------------------------------------------------


def test_pyslurm_jobs_map_to_slurm_jobs(pyslurm_module: types.ModuleType) -> None:
    jobs = {j.job_id: j for j in PySlurmBackend(pyslurm_module).jobs()}
    assert jobs[7] == SlurmJob(
        job_id=7,
        name="train",
        user="alice",
        state="RUNNING",
        reason="None",
        partition="gpu",
        nodes="n[1-2]",
        node_count=2,
        gpus_per_node=4,
        comment="hpcorch:id=x,min=4,max=8",
        submit_time=1700000000,
        start_time=1700000010,
        end_time=1700003610,
        time_limit_min=60,
        restarts=1,
        exit_code=0,
        work_dir="/home/alice",
        reservation="pool",
        held=False,
        uid=1000,
        cpus=8,
    )
    held = jobs[8]  # a flag in place of the base state, as pyslurm reports it
    assert (held.state, held.held, held.reason) == ("PENDING", True, "JobHeldUser")
    assert not held.special_exit and not jobs[7].special_exit
    assert held.nodes == "" and held.gpus == 2 and held.time_limit_min == 0
    assert held.exit_code == 128 + 15


def test_pyslurm_reads_a_job_requeued_in_special_exit() -> None:
    """pyslurm 25.11 gives such a job's state as 'SPECIAL_EXIT' (checked on the 25.11 pool)."""
    from hpcorch.slurm.pyslurm_map import job_from_pyslurm

    job = FakeJob(
        5, [], state="SPECIAL_EXIT", state_reason="job_requeued_in_held_state",
        allocated_nodes=None, num_nodes=1, gres_per_node={"gpu": 2}, priority=0,
        requeue_count=1, time_limit=None,
    )  # fmt: skip
    seen = job_from_pyslurm(job)
    assert (seen.state, seen.held, seen.special_exit, seen.restarts) == ("PENDING", True, True, 1)


def test_pyslurm_nodes_partitions_reservations(pyslurm_module: types.ModuleType) -> None:
    backend = PySlurmBackend(pyslurm_module)
    nodes = {n.name: n for n in backend.nodes()}
    assert nodes["n1"] == SlurmNode(
        name="n1",
        address="10.0.0.1",
        states=("MIXED",),
        partitions=("gpu",),
        cpus=64,
        gpus=4,
        gpus_used=2,  # job 9's; job 10 has ended
        reason="",
        cpus_used=6,
        gpu_type="a100",
    )
    assert nodes["n1"].usable and not nodes["n2"].usable and nodes["n2"].gpu_type == ""
    assert nodes["n2"].states == ("IDLE", "DRAIN") and nodes["n2"].gpus == 4
    assert backend.partitions() == (["debug", "gpu"], "gpu")
    assert backend.reservations() == {"pool": ["n1", "n2"]}
    assert backend.reservation_nodes("pool") == ["n1", "n2"]
    with pytest.raises(SlurmCommandError, match="not found"):
        backend.reservation_nodes("other")
    assert backend.calls == 6  # one RPC per query, and Jobs.load for the GPUs in use


def test_pyslurm_jobs_as_pyslurm_25_11_gives_them(pyslurm_module: types.ModuleType) -> None:
    backend = PySlurmBackend(pyslurm_module)
    jobs = {j.job_id: j for j in backend.jobs()}
    gpu = jobs[9]  # "gres/gpu" key, GPUs per node from the layout, CPUs per GPU inferred
    assert (gpu.gpus_per_node, gpu.gpus_by_node, gpu.gpus, gpu.cpus_per_gpu) == (2, (2,), 2, 3)
    assert jobs[7].cpus_per_gpu == 0  # cpus_per_task set: the job asked no CPUs per GPU
    ended = jobs[10]  # Jobs.load lists ended jobs too: a resize's exit 75 is not "lost"
    assert (ended.state, ended.exit_code, ended.gpus_by_node) == ("FAILED", 75, (4,))
    assert sorted(j.job_id for j in backend.jobs("pool")) == [7, 8, 10]
    # nodes() right after jobs() counts GPUs in use from the same load: 2 RPCs a cycle
    assert {n.name: n.gpus_used for n in backend.nodes()} == {"n1": 2, "n2": 0}
    assert backend.calls == 2 + 1


def test_pyslurm_reservation_flags_are_scontrol_names(pyslurm_module: types.ModuleType) -> None:
    class ReservationFlags(enum.Flag):  # pyslurm.ReservationFlags' members, by name
        IGNORE_RUNNING_JOBS = 1
        SPECIFIC_NODES = 2
        MAINTENANCE = 4

    resv = Obj(
        name="pool",
        nodes="n[1-2]",
        end_time=2111047959,
        flags=ReservationFlags.IGNORE_RUNNING_JOBS | ReservationFlags.SPECIFIC_NODES,
        users=["alice", "bob"],
    )
    pyslurm_module.Reservations = Obj(load=lambda: {"pool": resv})  # type: ignore[attr-defined]
    found = PySlurmBackend(pyslurm_module).reservation("pool")
    assert found.flags == ("IGNORE_JOBS", "SPECIFIC_NODES")
    assert (found.nodes, found.users, found.end_time) == ("n[1-2]", "alice,bob", 2111047959.0)


def test_pyslurm_actions(pyslurm_module: types.ModuleType) -> None:
    log: list[tuple[Any, ...]] = pyslurm_module.log  # type: ignore[attr-defined]
    cli = RecordingCLI()
    backend = PySlurmBackend(pyslurm_module, cli=cli)
    backend.cancel(3)
    backend.cancel(3, signal="USR2", batch_only=True)
    backend.cancel(3, signal="SIGTERM")
    backend.hold(3)
    backend.release(3)
    backend.requeue_hold(3)
    backend.set_comment(3, "hpcorch:id=x,pin=2")
    backend.start_now(3)
    assert log[:7] == [
        ("cancel", 3),
        ("send_signal", 3, "SIGUSR2", "batch"),
        ("send_signal", 3, "SIGTERM", "children"),
        ("hold", 3),
        ("release", 3),
        ("requeue", 3, True),
        ("modify", 3, {"comment": "hpcorch:id=x,pin=2"}),
    ]
    assert log[7][:2] == ("modify", 3) and set(log[7][2]) == {"begin_time"}
    # what pyslurm cannot change goes through scontrol
    backend.set_shape(3, 2, 4, ["n1", "n2"])
    backend.create_reservation("pool", "n[1-2]", "alice")
    assert [a[:3] for a in cli.argv] == [
        ["scontrol", "update", "jobid=3"],
        ["scontrol", "create", "reservation"],
    ]
    assert backend.calls == 8 + 2


def test_pyslurm_errors_become_one_line_hpcorch_errors(
    pyslurm_module: types.ModuleType,
) -> None:
    backend = PySlurmBackend(pyslurm_module)
    with pytest.raises(SlurmCommandError, match="pyslurm release failed: Invalid job id"):
        backend.release(404)

    def down() -> None:
        raise pyslurm_module.RPCError("Unable to contact slurm controller (connect failure)")  # type: ignore[attr-defined]

    pyslurm_module.Jobs = Obj(load=down)  # type: ignore[attr-defined]
    with pytest.raises(SlurmUnavailable, match="not reachable"):
        backend.jobs()


def test_pyslurm_cluster_tolerates_like_the_cli(pyslurm_module: types.ModuleType) -> None:
    def not_held(self: FakeJob) -> None:
        raise pyslurm_module.RPCError("Job is not held")  # type: ignore[attr-defined]

    FakeJob.release, saved = not_held, FakeJob.release  # type: ignore[method-assign]
    try:
        cluster = SlurmCluster("pool", backend=PySlurmBackend(pyslurm_module, cli=RecordingCLI()))
        cluster.start(3, Shape(nodes=1, gpus_per_node=2, node_names=()))
        assert cluster.flush() == {}  # the release, sent with the cycle's others
        assert cluster.reservation_nodes() == ("n1", "n2")
    finally:
        FakeJob.release = saved  # type: ignore[method-assign]


def test_submit_options_from_the_golden_script() -> None:
    script = GOLDEN.read_text()
    opts = submit_options(script, ["--reservation=pool", "--partition=debug"])
    assert opts["script"] == script
    assert {k: v for k, v in opts.items() if k != "script"} == {
        "ntasks": 0xFFFFFFFE,  # not set, as with sbatch (pyslurm would send 1)
        "reservations": ["pool"],
        "partitions": ["debug"],  # the command line wins, as with sbatch
        "name": "train",
        "nodes": "2",
        "gres_per_node": "gpu:2",
        "cpus_per_gpu": "4",
        "time_limit": "2:00:00",
        "standard_output": "/home/u/.hpcorch/jobs/train-20260101-000000-abcd/slurm-%j.out",
        "log_files_open_mode": "append",
        "is_requeueable": True,
        "signal": "B:SIGUSR2@120",
        "comment": "hpcorch:id=train-20260101-000000-abcd,min=4,max=8,batch=256,maxbatch=2048",
    }
    # pyslurm 25.11 passes a digit string on as is ("an integer is required"); --mincpus
    # (managed jobs) is its min_cpus_per_node
    minutes = submit_options("#!/bin/bash\n#SBATCH --time=10\n#SBATCH --mincpus=4\n")
    assert (minutes["time_limit"], minutes["min_cpus_per_node"]) == (10, "4")
    held = submit_options("#!/bin/bash\n#SBATCH --hold\necho\n#SBATCH --nodes=9\n")
    # options stop at a command
    assert held == {"script": held["script"], "ntasks": 0xFFFFFFFE, "priority": 0}
    with pytest.raises(SlurmCommandError, match="cannot submit sbatch option '--switches'"):
        submit_options("#!/bin/bash\n#SBATCH --switches=1\n")


def test_pyslurm_submit(pyslurm_module: types.ModuleType) -> None:
    backend = PySlurmBackend(pyslurm_module)
    assert backend.submit(GOLDEN.read_text()) == 99
    ((what, kw),) = pyslurm_module.log  # type: ignore[attr-defined]
    assert what == "submit" and kw["name"] == "train" and kw["signal"] == "B:SIGUSR2@120"
    # the environment as sbatch exports it, never left to pyslurm's read of the C environ
    assert kw["environment"] == dict(os.environ)


class LeaseCLI(RecordingCLI):
    """sbatch refuses the pool's reservation (a site's reservation for its users only)."""

    def run(self, argv: Sequence[str], stdin: str | None = None, **kw: Any) -> str:
        if argv[0] == "sbatch":
            self.argv.append(list(argv))
            if "--reservation=pool" in argv:
                raise SlurmCommandError(
                    "sbatch failed: sbatch: error: Batch job submission failed: "
                    "Access denied to requested reservation"
                )
            return "41\n"
        return super().run(argv, stdin)


def test_a_lease_job_the_reservation_refuses_is_placed_outside_it_naming_the_pool() -> None:
    cli = LeaseCLI()
    cluster = SlurmCluster("pool", backend=cli)
    cluster._partition = "gpu"  # the pool nodes' partition, as read
    assert cluster.create_lease("hpcorch-lease:owner=h:1,token=ab,seq=1,beat=0") == 41
    first, second = cli.argv
    assert "--reservation=pool" in first and not any("reservation" in a for a in second)
    assert "--comment=hpcorch-lease:owner=h:1,token=ab,seq=1,beat=0,pool=pool" in second
    assert "--partition=gpu" in second and "--hold" in second
    cli.argv.clear()
    cluster.create_lease("hpcorch-lease:owner=h:1,token=ab,seq=2,beat=0")  # remembered
    assert len(cli.argv) == 1 and not any("reservation" in a for a in cli.argv[0])
    cluster.write_lease(41, "hpcorch-lease:owner=h:1,token=ab,seq=3,beat=0")
    assert cli.argv[-1][-1].endswith(",seq=3,beat=0,pool=pool")


def test_lease_jobs_outside_the_reservation_count_only_for_the_pool_they_name() -> None:
    def job(job_id: int, resv: str, comment: str, name: str = "hpcorch-lease") -> dict[str, Any]:
        return {"job_id": job_id, "resv_name": resv, "comment": comment, "name": name,
                "job_state": "PENDING", "user_id": 990}  # fmt: skip

    note = "hpcorch-lease:owner=h:1,token=ab,seq=1,beat=0"
    doc = {
        "jobs": [
            job(1, "pool", note),
            job(2, "", note + ",pool=pool"),
            job(3, "", note + ",pool=other"),
            job(4, "", note + ",pool=pool", name="not-a-lease"),
            job(5, "other", note + ",pool=pool"),
            job(6, "", "hpcorch:id=x"),
        ]
    }
    cli = SlurmCLI()
    cli._json = lambda argv: doc  # type: ignore[method-assign]
    cli.run = lambda argv, *a, **k: signatures(doc)  # type: ignore[method-assign]
    cli.uid = 990
    cluster = SlurmCluster("pool", backend=cli)
    assert [j.slurm_id for j in cluster.lease_jobs()] == [1, 2]
