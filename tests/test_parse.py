"""Parsing squeue/sinfo JSON: recorded Slurm 22.05 output and the 23.11+/24.x shapes."""

from __future__ import annotations

import json
from pathlib import Path

from hpcorch.slurm.parse import gpu_type_in, gpus_in, parse_nodes, parse_squeue

FIXTURES = Path(__file__).parent / "fixtures"


def test_squeue_22_05_recorded() -> None:
    doc = json.loads((FIXTURES / "slurm-22.05" / "squeue.json").read_text())
    jobs = {j.job_id: j for j in parse_squeue(doc)}
    running = next(j for j in jobs.values() if j.comment == "hpcorch:test")
    assert running.name == "my job"
    assert running.state == "RUNNING"
    assert running.gpus_per_node == 2 and running.node_count == 1 and running.gpus == 2
    assert running.nodes == "n1" and running.user == "root" and not running.held
    pending = [j for j in jobs.values() if j.state == "PENDING"]
    assert pending and all(j.gpus == 16 for j in pending)
    # tests/fixtures/record: one waits for job 4's GPUs, one is held (sbatch --hold)
    assert {j.reason: j.held for j in pending} == {"Resources": False, "JobHeldUser": True}


def test_sinfo_22_05_recorded() -> None:
    doc = json.loads((FIXTURES / "slurm-22.05" / "sinfo.json").read_text())
    nodes = {n.name: n for n in parse_nodes(doc)}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert all(n.gpus == 4 and n.cpus == 8 and n.usable for n in nodes.values())
    assert nodes["n1"].gpus_used == 2 and nodes["n1"].partitions == ("gpu",)


def test_squeue_24_shapes() -> None:
    """23.11+ lists states, wraps numbers in {set, infinite, number}, structures exit codes."""
    doc = {
        "jobs": [
            {
                "job_id": 42,
                "name": "bert",
                "user_name": "alice",
                "job_state": ["PENDING", "REQUEUED"],
                "state_reason": "JobHeldUser",
                "priority": {"set": True, "infinite": False, "number": 0},
                "node_count": {"set": True, "infinite": False, "number": 2},
                "tres_per_node": "gres/gpu:4",
                "comment": "hpcorch:id=bert-1,min=4,max=8",
                "submit_time": {"set": True, "infinite": False, "number": 1700000000},
                "start_time": {"set": False, "infinite": False, "number": 0},
                "time_limit": {"set": False, "infinite": True, "number": 0},
                "restart_cnt": 3,
                "exit_code": {
                    "status": ["EXITED"],
                    "return_code": {"set": True, "infinite": False, "number": 75},
                },
            }
        ]
    }
    (job,) = parse_squeue(doc)
    assert (job.job_id, job.state, job.reason) == (42, "PENDING", "JobHeldUser")
    assert job.held and job.node_count == 2 and job.gpus == 8
    assert job.submit_time == 1700000000 and job.start_time == 0 and job.time_limit_min == 0
    assert job.restarts == 3 and job.exit_code == 75


def test_nodes_24_shapes() -> None:
    doc = {
        "nodes": [
            {
                "name": "c1",
                "state": ["IDLE"],
                "gres": "gpu:a100:8",
                "gres_used": "gpu:a100:0(IDX:N/A)",
                "cpus": 64,
                "partitions": ["gpu"],
            },
            {"name": "c2", "state": ["IDLE", "DRAIN"], "gres": "gpu:a100:8", "cpus": 64},
            {"name": "c3", "state": "down*", "gres": "gpu:8", "cpus": 64},
        ]
    }
    nodes = {n.name: n for n in parse_nodes(doc)}
    assert nodes["c1"].gpus == 8 and nodes["c1"].gpus_used == 0 and nodes["c1"].usable
    assert not nodes["c2"].usable
    assert not nodes["c3"].usable
    assert [nodes[n].gpu_type for n in ("c1", "c2", "c3")] == ["a100", "a100", ""]


def test_gpu_types_in_gres_strings() -> None:
    """What sinfo and scontrol print for a node's GRES, typed or not (22.05 to 25.11)."""
    assert gpu_type_in("gpu:a100:4") == "a100"
    assert gpu_type_in("gpu:v100:4(S:0)") == "v100"
    assert gpu_type_in("gres/gpu:h100:8,gres/gpu:a100:2") == "h100"  # the first of several
    assert gpu_type_in("gpu:4(S:0-1)") == "" and gpu_type_in("gpu:4") == ""
    assert gpu_type_in("mps:100,gpu:t4:2") == "t4"
    assert gpu_type_in("") == "" and gpu_type_in(None) == ""


def test_gpus_in_tres_strings() -> None:
    assert gpus_in("gres:gpu:4") == 4
    assert gpus_in("gres/gpu:v100:2") == 2
    assert gpus_in("cpu=8,mem=1G,gres/gpu=4") == 4
    assert gpus_in("gpu:2(IDX:0-1)") == 2
    assert gpus_in("cpu=8") == 0 and gpus_in(None) == 0


def test_exit_code_of_22_05_is_a_wait_status() -> None:
    def job(code: object) -> dict[str, object]:
        return {"job_id": 1, "job_state": "FAILED", "exit_code": code}

    codes = [j.exit_code for j in parse_squeue({"jobs": [job(75 << 8), job(9), job(0)]})]
    assert codes == [75, 137, 0]


def test_flag_states_read_as_their_base_state() -> None:
    jobs = parse_squeue(
        {
            "jobs": [
                {"job_id": 1, "job_state": "REQUEUE_HOLD", "priority": 0},
                {"job_id": 2, "job_state": ["REQUEUED"], "priority": 100},
                {"job_id": 3, "job_state": ["RUNNING", "SIGNALING"]},
                {"job_id": 4, "job_state": "SIGNALING"},
            ]
        }
    )
    assert [(j.state, j.held) for j in jobs] == [
        ("PENDING", True),
        ("PENDING", False),
        ("RUNNING", False),
        ("RUNNING", False),
    ]


def test_a_job_requeued_in_special_exit_is_pending_held_and_says_so() -> None:
    """hpcorch's wrapper requeues its job with ``requeuehold State=SpecialExit`` after a
    checkpoint: 22.05 prints the flag as the state, 23.11+ lists it (as the pools showed)."""
    jobs = parse_squeue(
        {
            "jobs": [
                {"job_id": 1, "job_state": "SPECIAL_EXIT", "priority": 0, "restart_cnt": 1},
                {"job_id": 2, "job_state": ["PENDING", "SPECIAL_EXIT"], "priority": 0},
                {"job_id": 3, "job_state": "REQUEUE_HOLD", "priority": 0},
            ]
        }
    )
    assert [(j.state, j.held, j.special_exit) for j in jobs] == [
        ("PENDING", True, True),
        ("PENDING", True, True),
        ("PENDING", True, False),
    ]


def test_sacct_rows_keep_account_and_qos() -> None:
    from hpcorch.slurm.parse import SACCT_FIELDS, parse_sacct

    assert SACCT_FIELDS.endswith(",Account,QOS,Comment")  # the comment last: it may hold '|'
    row = (
        "41|train|alice|COMPLETED|gpu|pool|gpu-a[001-002]|2|billing=8,cpu=8,gres/gpu=8|"
        "2026-11-24T10:00:00|2026-11-24T10:00:05|2026-11-24T10:30:00|60|0:0|/home/a|"
        "ml|high|hpcorch:id=x|min=2"
    )
    odd = "42_1|array|bob|FAILED|gpu|||1|gres/gpu=1|||||/|physics|normal|"
    (job,) = parse_sacct(row + "\n" + odd + "\n")
    assert (job.job_id, job.account, job.qos) == (41, "ml", "high")
    assert job.comment == "hpcorch:id=x|min=2" and job.gpus == 8 and job.gpus_per_node == 4
    assert job.nodes == "gpu-a[001-002]" and job.state == "COMPLETED" and job.exit_code == 0


def test_the_pool_shows_a_type_column_only_for_typed_gpus() -> None:
    from hpcorch.slurm.parse import SlurmNode
    from hpcorch.status import pool_rows, render_pool

    def node(name: str, gres_type: str) -> SlurmNode:
        return SlurmNode(name, "", ("IDLE",), ("gpu",), 8, 4, 1, "", gpu_type=gres_type)

    plain = render_pool(pool_rows([node("n1", ""), node("n2", "")]))
    assert plain.splitlines()[1].split() == ["NODE", "STATE", "GPUS", "BUSY"]
    typed = render_pool(pool_rows([node("n1", "a100"), node("n2", "v100"), node("n3", "")]))
    lines = typed.splitlines()
    assert lines[1].split() == ["NODE", "STATE", "TYPE", "GPUS", "BUSY"]
    assert [ln.split()[2] for ln in lines[2:]] == ["a100", "v100", "-"]


def test_a_node_being_emptied_says_why_a_failed_one_does_not() -> None:
    """Issue 33: a drained node and one whose reboot waits (scontrol reboot ASAP, as 22.05
    reports it: state idle, flags DRAIN and REBOOT_REQUESTED) are being left, with the
    admin's reason; a node that is down is not (Slurm requeues its jobs itself)."""
    nodes = parse_nodes(
        {
            "nodes": [
                {"name": "n1", "state": "mixed", "state_flags": ["DRAIN"], "reason": "repair"},
                {"name": "n2", "state": "idle", "state_flags": ["DRAIN", "REBOOT_REQUESTED"],
                 "reason": "kernel"},
                {"name": "n3", "state": "down", "state_flags": ["DRAIN", "REBOOT_ISSUED"]},
                {"name": "n4", "state": "mixed", "state_flags": []},
                {"name": "n5", "state": ["IDLE", "DRAIN"], "reason": "x\x1b[2Jy"},
                {"name": "n6", "state": ["MIXED", "DRAIN"], "reason": "Duplicate jobid"},
            ]
        }
    )  # fmt: skip
    why = {n.name: n.leaving for n in nodes}
    assert why["n1"] == "drained by an admin (Reason=repair)"
    assert why["n2"] == "a reboot is pending (Reason=kernel)"
    assert why["n3"] == "" and why["n4"] == ""
    assert why["n5"] == "drained by an admin (Reason=x?[2Jy)"  # no terminal escapes
    assert why["n6"] == "drained by Slurm (Reason=Duplicate jobid)"  # its own reasons
    assert not any(n.usable for n in nodes if n.name != "n4")


def test_a_jobs_batch_and_requeue_flags() -> None:
    """Issue 34: an interactive allocation (batch_flag false) and Requeue=0 (requeue false)
    are read from every release's JSON; absent, a job counts as a requeueable batch job."""
    doc = {
        "jobs": [
            {"job_id": 1, "job_state": "PENDING", "batch_flag": False, "requeue": True},
            {"job_id": 2, "job_state": ["RUNNING"], "batch_flag": True, "requeue": False},
            {"job_id": 3, "job_state": "PENDING"},
        ]
    }
    jobs = {j.job_id: j for j in parse_squeue(doc)}
    assert (jobs[1].batch, jobs[1].requeue) == (False, True)
    assert (jobs[2].batch, jobs[2].requeue) == (True, False)
    assert (jobs[3].batch, jobs[3].requeue) == (True, True)
