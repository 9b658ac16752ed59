"""A new global batch for a running script that does not use the runtime.

The controller changes a running job's global batch (same GPUs) by rewriting its plan
with the same launch number. The sidecar watches the plan and passes the new split on in
a small JSON file, ``$HPCORCH_BATCH_FILE`` (``<job dir>/batch.json``), written at every
launch and rewritten atomically on every change::

    {"global_batch": 512, "per_gpu_batch": 64, "accum_steps": 2, "gpus": 4, "launch": 3,
     "time": 1795302638.4}

A script submitted with ``--live-batch`` promises to read it between steps (when its
modification time changes) and to train with the new per-GPU batch and accumulation from
its next step; for any other script the controller changes the batch only by relaunching
it (docs/sidecar.md).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hpcorch.planner import PlanWatcher, batch_from_plan


class LiveBatch:
    """The batch of the running launch, and the file that carries it to the script."""

    def __init__(
        self,
        path: Path,
        plan_path: str | None,
        gpus: int,
        launch: int,
        job_id: str | None,
        plan_launch: int | None,
    ) -> None:
        self.path = path
        self.watch = PlanWatcher(Path(plan_path)) if plan_path else None
        self.gpus = gpus
        self.launch = launch
        self.job_id = job_id
        self.plan_launch = plan_launch
        self.global_batch = 0
        self.per_gpu_batch = 0
        self.accum_steps = 1

    def write(self) -> None:
        """Write the batch file (nothing when the launch has no planned batch)."""
        if not self.global_batch:
            return
        doc = {
            "global_batch": self.global_batch,
            "per_gpu_batch": self.per_gpu_batch,
            "accum_steps": self.accum_steps,
            "gpus": self.gpus,
            "launch": self.launch,
            "time": time.time(),
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc) + "\n")
        os.replace(tmp, self.path)

    def poll(self) -> dict[str, Any] | None:
        """If the plan now asks for another global batch at these GPUs: take it, rewrite
        the batch file and return the ``rebatch`` metrics line; else None."""
        plan = self.watch.changed() if self.watch else None
        if plan is None:
            return None
        new = batch_from_plan(
            plan,
            world_size=self.gpus,
            job_id=self.job_id,
            launch=self.plan_launch,
            lower=None,
            upper=None,
        )
        if new is None or new.global_batch == self.global_batch:
            return None
        old = self.global_batch
        self.global_batch, self.per_gpu_batch = new.global_batch, new.micro_batch
        self.accum_steps = new.accum_steps
        self.write()
        return {
            "event": "rebatch",
            "from_batch": old,
            "global_batch": new.global_batch,
            "per_gpu_batch": new.micro_batch,
            "accum_steps": new.accum_steps,
        }
