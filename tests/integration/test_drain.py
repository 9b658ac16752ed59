"""Drains and maintenance windows on the real pool (issue 33), with jobs of real second Unix
users and the controller as the shipped unit runs it: an elastic job gives a drained node
back at its next checkpoint (the node DRAINED within 60 s), nothing is planned on it until
it is back; a maintenance reservation on a pool node is emptied by its start, every launch
there ending before it, and the jobs return once it is over. The same on the fake cluster:
tests/test_availability.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import Pool
from tests.integration.controller_util import wait_for
from tests.integration.site_jobs import Host, make_reservation, pool_of, shared_spool, submit
from tests.integration.users import ALICE, BOB, Site, site_beside

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


@pytest.fixture(scope="module")
def site(slurm_pool: Pool) -> Iterator[Site]:
    with site_beside(slurm_pool, 80) as s:
        yield s


def node_state(s: Site, node: str) -> str:
    return s.slurm("sinfo", "-h", "-N", "-n", node, "-o", "%t").stdout.strip()


def nodes_of(s: Site, job: int) -> str:
    j = pool_of(s).squeue().get(job)
    return j.nodes if j is not None and j.state == "RUNNING" else ""


def moved_and_running(host: Host, job: int, node: str) -> bool:
    """The controller logged that ``job`` moved off ``node``, and follows it running."""
    return f"moved off {node}" in host.text() and host.phase(job) == "running"


def test_a_drained_node_is_given_back_within_a_minute(site: Site) -> None:
    """An admin drains n2 under an elastic job that runs on n1 and n2: the job moves onto
    n1 at its next checkpoint and n2 is DRAINED within 60 s (it stayed DRAINING for as
    long as the job ran); nothing is planned on n2 while it is drained; `hpcorch status`
    says why the job moved; once n2 is resumed the job grows back onto it."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    host = Host(site, "host-drain", "open", spool, "--nodes", "n1,n2")
    host.start()
    try:
        job = submit(site, ALICE, "open", 1, 8, "good", spool=spool)
        wait_for("alice's job on both nodes", lambda: nodes_of(site, job) == "n[1-2]", 120,
                 host.log)  # fmt: skip
        wait_for("it trains", lambda: getattr(host.record(job), "ready", 0) == 1, 60, host.log)
        drained = time.time()
        site.slurm("scontrol", "update", "nodename=n2", "state=drain", "reason=repair")
        wait_for("n2 drained", lambda: node_state(site, "n2") == "drain", 60, host.log)
        took = time.time() - drained
        wait_for("alice's job on n1", lambda: nodes_of(site, job) == "n1", 60, host.log)
        print(f"drain: n2 was DRAINED {took:.1f} s after the drain")
        assert took <= 60
        # Slurm may list it on n1 alone while n2 completes, before the controller saw the
        # launch end: it runs again once the controller said it moved
        wait_for("it runs again", lambda: moved_and_running(host, job, "n2"), 60, host.log)
        reason = host.reason(job)
        assert "moved off n2" in reason and "repair" in reason, reason
        other = submit(site, BOB, "open", 1, 4, "good", spool=spool)
        wait_for("bob's job queued or on n1", lambda: host.phase(other) != "?", 60, host.log)
        time.sleep(5)
        assert "n2" not in nodes_of(site, other) and node_state(site, "n2") == "drain"
        site.slurm("scontrol", "update", "nodename=n2", "state=resume")
        wait_for("n2 in use again", lambda: "n2" in nodes_of(site, job) + nodes_of(site, other),
                 120, host.log)  # fmt: skip
        assert "Traceback" not in host.text()
    finally:
        site.slurm("scontrol", "update", "nodename=n2", "state=resume")
        site.slurm("scancel", "--reservation=open")
        host.stop()


def test_a_maintenance_window_is_emptied_by_its_start_and_given_back(site: Site) -> None:
    """A MAINT reservation on n2 from T (here 6 minutes ahead): the job started on n1 and
    n2 gets a time limit that ends before T (Slurm would not start it there otherwise),
    leaves n2 before T (at T - 180 s, or on Slurm's checkpoint signal ahead of that limit,
    which Slurm may send up to 60 s early: either way said as a move off n2), and returns
    to it once the window is over."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    window_s, length_min = 360, 1
    start = time.time() + window_s
    r = site.slurm(
        "scontrol", "create", "reservation", "ReservationName=maint", "Nodes=n2",
        "Users=root", f"StartTime=now+{window_s}seconds", f"Duration={length_min}",
        "Flags=MAINT,IGNORE_JOBS",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    host = Host(site, "host-maint", "open", spool, "--nodes", "n1,n2", "--grace", "10")
    host.start()
    try:
        job = submit(site, ALICE, "open", 1, 8, "good", spool=spool)
        wait_for("alice's job on both nodes", lambda: nodes_of(site, job) == "n[1-2]", 120,
                 host.log)  # fmt: skip
        limit = pool_of(site).squeue()[job].time_limit_min
        assert 0 < limit * 60 <= start - time.time() + 60, limit
        wait_for("alice's job off n2", lambda: nodes_of(site, job) == "n1", window_s, host.log)
        left = start - time.time()
        print(f"maintenance: n2 given back {left:.0f} s before the window")
        assert left > 0
        # (Slurm may list it on n1 alone while n2 completes, before the controller saw the
        # launch end)
        wait_for("it runs again", lambda: moved_and_running(host, job, "n2"), 60, host.log)
        # said in its reason (a later resize on n1, under load, starts a launch of its own)
        # and in the log
        said = [ln for ln in host.text().splitlines() if "moved off n2" in ln]
        assert any("maintenance window maint" in ln for ln in said), host.text()[-3000:]
        launches = getattr(host.record(job), "launches", 0)
        assert "maintenance window maint" in host.reason(job) or launches > 2, host.reason(job)
        wait_for("alice's job back on n2", lambda: nodes_of(site, job) == "n[1-2]",
                 window_s + 60 * length_min + 120, host.log)  # fmt: skip
        assert time.time() >= start + 60 * length_min
        assert "Traceback" not in host.text()
    finally:
        site.slurm("scontrol", "delete", "reservation", "maint")
        site.slurm("scancel", "--reservation=open")
        host.stop()
