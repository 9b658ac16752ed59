"""What keeps the pool the controller's, as the loop sees it each cycle: its holds made
admin holds (a job's owner cannot release them), and the jobs it did not place, named once
in the log and kept for ``hpcorch status``; and a check, every cycle, that the GPUs its
jobs hold on each node, as it sees them, are the GPUs Slurm shows in use there. The cluster
side that counts their GPUs as taken is hpcorch/slurm/cluster.py; docs/admin-guide.md has
the whole design."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence

from hpcorch.cluster import Observation, ObservedJob, PoolNode
from hpcorch.controller.actions import Action
from hpcorch.controller.snapshot import placement_of
from hpcorch.controller.store import JobRecord
from hpcorch.controller.validate import printable

VIEW_GRACE_S = 10.0
"""How long a node's GPUs in use may differ from the controller's view before it counts:
a launch or an end between Slurm's two reads, a node completing an ended job."""


class PoolGuard:
    def __init__(self, warn: Callable[[str], None]) -> None:
        self.warn = warn
        self._foreign_seen: set[int] = set()
        """Jobs not placed by the controller already warned about."""
        self._holds_sent: set[int] = set()
        """Jobs whose user hold the last cycle turned into the controller's own hold."""
        self.view_mismatches = 0
        """Cycles in which the GPUs in use on a node differed from what the controller's
        jobs hold there (stored as the meta key ``gpu_view_mismatches``)."""
        self._view_said: str = ""
        self._view_since: dict[str, tuple[tuple[int, frozenset[int]], float]] = {}
        """Each differing node's difference (GPUs in use less those held, and the jobs of
        the controller held there) and since when it has been that, without a break."""
        self.admin_holds: bool | None = None
        """Whether the controller's holds are admin holds a user cannot release (None: not
        seen yet; False: Slurm records them as user holds, the controller is no operator)."""

    def own_hold(self, rec: JobRecord, job: ObservedJob | None) -> list[Action]:
        """A queued job under its owner's hold (``sbatch --hold``, ``requeuehold``), which
        its owner could release, is held by the controller instead: an admin hold, which
        only an operator releases. Learned once: if Slurm still shows the user hold after
        the controller's, the controller is no operator (one warning; the wrapper still runs
        nothing without a plan, and the controller holds again what its owner releases)."""
        user_hold = (
            job is not None
            and job.held
            and job.reason == "JobHeldUser"
            and rec.phase in ("queued", "starting")
        )
        sent = rec.slurm_id in self._holds_sent
        self._holds_sent.discard(rec.slurm_id)
        if not user_hold:
            if sent and job is not None and job.reason == "JobHeldAdmin":
                self.admin_holds = True
            return []
        if sent and self.admin_holds is None:
            self.admin_holds = False
            self.warn(
                "Slurm keeps the controller's holds as user holds (JobHeldUser): its users can "
                "release their queued jobs. Run the controller as SlurmUser or a Slurm operator "
                "(sacctmgr modify user NAME set AdminLevel=Operator), or close the pool "
                "(slurm/job_submit.lua); meanwhile a job released by its user is held again and "
                "runs nothing without the controller's plan"
            )
        if self.admin_holds is False:
            return []
        self._holds_sent.add(rec.slurm_id)
        return [Action("hold", rec.slurm_id, reason="the controller's own hold")]

    def foreign(self, obs: Observation) -> str:
        """The jobs on the pool's nodes the controller did not place, as stored for
        ``hpcorch status`` (JSON); one warning for each new one."""
        rows = [f.to_json() for f in obs.foreign]
        ids = {f.slurm_id for f in obs.foreign}
        for f in obs.foreign:
            if f.slurm_id in self._foreign_seen:
                continue
            where = " ".join(f"{n}:{g}" for n, g in zip(f.node_names, f.gpus, strict=False))
            what = f"job {f.slurm_id} of {printable(f.user, 32)}" if f.slurm_id else "a job"
            self.warn(
                f"{what} ({printable(f.name)}, {f.state.lower()}) is in the pool without the "
                f"controller: {'its GPUs ' + where + ' are' if where else 'it is'} counted as "
                "taken, never planned"
            )
        self._foreign_seen = ids
        return json.dumps(rows)

    def view_afresh(self) -> None:
        """Slurm did not answer for a while: a difference must last ``VIEW_GRACE_S`` in
        what it shows from now on (the ends it takes in after the outage are no mismatch)."""
        self._view_since = {}

    def gpu_view(
        self,
        nodes: Sequence[PoolNode],
        records: Sequence[JobRecord],
        now: float,
        completing: Collection[int] = (),
    ) -> None:
        """Whether each usable node's GPUs in use, as Slurm shows them, are what the
        controller counts held there: its running (or stopping) jobs where Slurm shows them,
        and the jobs it did not place. A difference means the policy plans GPUs Slurm does
        not have free (a launch left pending) or leaves free ones idle: counted, and said
        once per distinct difference. Slurm's jobs and nodes are read by two commands, and a
        job that ended holds its GPUs while its node completes it (seconds): a node counts
        once one difference (its GPUs in use less those held, with the same jobs of the
        controller held there) has lasted ``VIEW_GRACE_S`` without a break (a busy node seen
        at cycles far apart, each catching another launch or end between the two reads, has
        a new difference each time, not a lasting one, even when it is of the same size). A
        job Slurm shows completing (``completing``: job ids) may or may not hold its GPUs in
        Slurm's view of its nodes (Slurm 22.05 frees them as the job ends, before its nodes
        have completed it, which takes long when slurmctld is busy): either count agrees."""
        index = {n.name: i for i, n in enumerate(nodes)}
        held = [n.gpus_foreign for n in nodes]
        ending = [0] * len(nodes)
        ids: list[set[int]] = [set() for _ in nodes]
        for rec in records:
            if rec.phase in ("running", "stopping"):
                for i, g in placement_of(rec, index).items():
                    held[i] += g
                    ids[i].add(rec.slurm_id)
                    if rec.slurm_id in completing:
                        ending[i] += g
        differs = {
            n.name: (
                (n.gpus_used - h, frozenset(j)),
                f"{n.name} {n.gpus_used} in use, {h} held by its jobs",
            )
            for n, h, e, j in zip(nodes, held, ending, ids, strict=True)
            if n.usable and not h - e <= n.gpus_used <= h
        }
        before = self._view_since
        self._view_since = {
            n: before[n] if n in before and before[n][0] == d else (d, now)
            for n, (d, _) in differs.items()
        }
        diff = [t for n, (_, t) in differs.items() if now - self._view_since[n][1] >= VIEW_GRACE_S]
        said = "; ".join(diff)
        if diff:
            self.view_mismatches += 1
            if said != self._view_said:
                self.warn(f"the GPUs Slurm shows in use differ from the controller's: {said}")
        self._view_said = said
