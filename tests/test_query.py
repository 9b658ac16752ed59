"""What the controller's query socket answers each user (pure: hpcorch.controller.query),
on a real store: the asker's own jobs in full, other users' as squeue shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcorch.cli.poolview import View
from hpcorch.controller.query import (
    MAX_REQUEST,
    PUBLIC_FIELDS,
    QueryError,
    Reader,
    Request,
    Viewer,
    answer,
    parse_request,
    record_from,
)
from hpcorch.controller.store import JobRecord, Sample, Store
from hpcorch.report import Report, from_store

ALICE = Viewer(1001, "alice", False)
ROOT = Viewer(0, "root", True)
T0 = 1_700_000_000.0


def job(slurm_id: int, user: str, uid: int, **kw: object) -> JobRecord:
    rec = JobRecord(
        slurm_id=slurm_id, job_key=f"k{slurm_id}", name=f"{user}-job", user=user,
        job_dir=f"/home/{user}/.hpcorch/jobs/k{slurm_id}", app="", min_gpus=1, max_gpus=4,
        batch=32, max_batch=256, max_micro=64, submit_time=T0, phase="running",
        phase_since=T0 + 10, gpus=2, global_batch=64, micro_batch=32, accum_steps=1,
        samples_per_s=120.0, reason=f"cannot read /home/{user}/secret/metrics.jsonl",
        uid=uid, gpu_seconds=7200.0, started_at=T0 + 5, launches=1,
    )  # fmt: skip
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


@pytest.fixture
def reader(tmp_path: Path) -> Reader:
    store = Store(tmp_path / "state.db", clock=lambda: T0 + 15)
    store.put_jobs(
        [job(11, "alice", 1001), job(12, "bob", 1002), job(13, "carol", -1, phase="done")]
    )
    store.set_meta("pool", json.dumps([{"name": "n1", "gpus": 4, "gpus_used": 4, "usable": 1}]))
    for jid in (11, 12):
        d = store.add_decision(jid, "start", 0, 2, 64, f"start on n1 (dir /home/x/{jid})")
        store.finish_decision(d)
        store.add_samples(
            [
                Sample(jid, T0 + 20 + i, 2, 1, 32, 1, 64 + 64 * (i > 1), 0.5, 120.0, 2.0 - i / 10)
                for i in range(4)
            ]
        )
    return Reader(store, ttl=0)


def test_status_gives_the_askers_jobs_in_full_and_others_as_squeue_does(reader: Reader) -> None:
    reply = answer(Request("status"), ALICE, reader)
    jobs = {j["slurm_id"]: j for j in reply["jobs"]}
    assert jobs[11]["full"] and jobs[11]["job_dir"] == "/home/alice/.hpcorch/jobs/k11"
    assert jobs[11]["samples_per_s"] == 120.0 and "secret" in jobs[11]["reason"]
    for other in (12, 13):
        assert set(jobs[other]) == {*PUBLIC_FIELDS, "full"} and not jobs[other]["full"]
    assert jobs[12]["phase"] == "running" and jobs[12]["gpus"] == 2 and jobs[12]["user"] == "bob"
    assert "/home/bob" not in json.dumps(reply) and "/home/carol" not in json.dumps(reply)
    assert reply["pool"][0]["name"] == "n1" and reply["foreign"] == []
    # the client's records: bob's reduced record carries nothing of his but what is public
    bob = record_from(jobs[12])
    assert (bob.job_dir, bob.reason, bob.samples_per_s, bob.global_batch) == ("", "", 0.0, 0)
    assert bob.gpu_seconds == 7200.0  # usage by user, as sshare shows it


def test_root_and_the_controllers_user_see_everything(reader: Reader) -> None:
    assert Viewer.of(0, 999).everything and Viewer.of(999, 999).everything
    assert not Viewer.of(1001, 999).everything
    jobs = answer(Request("status"), ROOT, reader)["jobs"]
    assert all(j["full"] for j in jobs) and {j["slurm_id"] for j in jobs} == {11, 12, 13}


def test_a_record_without_a_uid_is_matched_by_name() -> None:
    old = job(13, "carol", -1)
    assert Viewer(1003, "carol", False).owns(old)
    assert not Viewer(1003, "", False).owns(old) and not ALICE.owns(old)
    assert not Viewer(1002, "alice", False).owns(job(11, "alice", 1001))  # uid decides


def test_describe_of_anothers_job_is_its_public_record(reader: Reader) -> None:
    mine = answer(Request("describe", 11), ALICE, reader)
    assert mine["job"]["full"] and mine["decisions"][0]["action"] == "start"
    assert mine["throughput"] == [(2, 120.0, 4)] and mine["decisions_left_out"] == 0
    his = answer(Request("describe", 12), ALICE, reader)
    assert set(his) == {"ok", "v", "user", "everything", "job"}
    assert set(his["job"]) == {*PUBLIC_FIELDS, "full"}
    assert answer(Request("describe", 99), ALICE, reader)["job"] is None


def test_the_report_keeps_everyones_gpus_and_only_the_askers_batches_and_losses(
    reader: Reader, tmp_path: Path
) -> None:
    full = from_store(tmp_path / "state.db")
    rep = Report.from_json(answer(Request("report"), ALICE, reader)["report"])
    by_id = {j.job_id: j for j in rep.jobs}
    assert by_id[11].batches == [64, 128] and by_id[11].final_loss == 1.7
    assert by_id[12].batches == [] and by_id[12].final_loss is None
    assert [m.kind for m in by_id[12].marks] == []  # its one batch change: gone
    assert [s.gpus for s in by_id[12].segments] == [s.gpus for s in full.jobs[1].segments]
    assert rep.utilisation == full.utilisation and rep.mean_utilisation() > 0


def test_metrics_show_the_pool_and_the_askers_jobs(reader: Reader) -> None:
    pytest.importorskip("prometheus_client")
    text = answer(Request("metrics"), ALICE, reader)["metrics"]
    assert 'hpcorch_job_gpus{name="alice-job",slurm_job_id="11",user="alice"} 2.0' in text
    assert 'slurm_job_id="12"' not in text and 'hpcorch_pool_gpus{state="busy"} 4.0' in text
    assert 'hpcorch_user_gpus{user="bob"} 2.0' in text  # usage by user: everyone's
    assert 'slurm_job_id="12"' in answer(Request("metrics"), ROOT, reader)["metrics"]
    one = answer(Request("metrics", 11), ALICE, reader)["metrics"]
    assert 'slurm_job_id="11"' in one
    with pytest.raises(QueryError, match=r"^job 12 is bob's: its metrics are shown to bob and"):
        answer(Request("metrics", 12), ALICE, reader)
    with pytest.raises(QueryError, match=r"^no job 99 in the controller's state$"):
        answer(Request("metrics", 99), ALICE, reader)


def test_whole_pool_reads_are_shared_for_a_moment(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.put_job(job(11, "alice", 1001))
    now = [0.0]
    reader = Reader(store, ttl=2.0, clock=lambda: now[0])
    assert len(reader.records()) == 1
    store.put_job(job(12, "bob", 1002))
    assert len(reader.records()) == 1
    now[0] = 2.5
    assert len(reader.records()) == 2


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "not one JSON object"),
        (b"\x00\xffgarbage", "not one JSON object"),
        (b"[1, 2]", "not one JSON object"),
        (b"[" * 4000 + b"]" * 4000, "request over 4096 bytes"),
        (b"[" * 2000 + b"]" * 2000, "not one JSON object"),
        (b'{"q": "status", "uid": 0}', "unknown request key 'uid'"),
        (b'{"q": "status", "user": "root"}', "unknown request key 'user'"),
        (b'{"q": "status", "v": 2}', "unsupported request version"),
        (b'{"q": "status", "v": true}', "unsupported request version"),
        (b'{"q": "dump"}', "unknown query (valid: status, describe, report, metrics)"),
        (b'{"q": ["status"]}', "unknown query"),
        (b'{"q": "describe"}', "describe needs a job"),
        (b'{"q": "describe", "job": true}', "job must be a Slurm job id"),
        (b'{"q": "describe", "job": "7"}', "job must be a Slurm job id"),
        (b'{"q": "describe", "job": 0}', "job must be a Slurm job id"),
        (b'{"q": "describe", "job": 99999999999999999999}', "job must be a Slurm job id"),
        (b'{"q": "describe", "job": 7.0}', "job must be a Slurm job id"),
        (b'{"q": "status", "job": 7}', "status takes no job"),
        (b'{"q": "status", "' + b"k" * 5000 + b'": 1}', "request over 4096 bytes"),
    ],
)
def test_a_bad_request_is_one_line(data: bytes, error: str) -> None:
    with pytest.raises(QueryError, match=error.replace("(", r"\(").replace(")", r"\)")) as exc:
        parse_request(data)
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 200


def test_good_requests() -> None:
    assert parse_request(b'{"v": 1, "q": "status"}') == Request("status")
    assert parse_request(b'{"q": "describe", "job": 4294967293}') == Request("describe", 4294967293)
    assert parse_request(b'{"q": "metrics"}') == Request("metrics")
    assert len(json.dumps({"v": 1, "q": "describe", "job": 4294967293})) < MAX_REQUEST


def test_a_newer_controllers_record_and_report_are_read() -> None:
    rec = record_from({"slurm_id": 5, "name": "x", "user": "u", "phase": "queued",
                       "submit_time": 1.0, "phase_since": 1.0, "min_gpus": 1, "max_gpus": 2,
                       "a_column_of_tomorrow": 3})  # fmt: skip
    assert (rec.slurm_id, rec.job_dir, rec.max_gpus) == (5, "", 2)
    view = View([rec], [], set())
    assert view.records[0].user == "u"


def test_the_report_survives_json(reader: Reader, tmp_path: Path) -> None:
    rep = from_store(tmp_path / "state.db")
    again = Report.from_json(json.loads(json.dumps(rep.to_json())))
    assert again == rep
