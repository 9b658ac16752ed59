"""One user's submissions for benchmarks/site_scale.py, through hpcorch's Python API.

Run as that user (its own uid, gid and groups), it reads one JSON object per line on
stdin (the job's name and ``hpcorch submit`` options: ``api.Executor`` keywords, the
script and its arguments) and answers one line per job on stdout: ``NAME SLURM_ID`` or
``NAME error MESSAGE``. One process per user submits all of the user's jobs: each
submission makes the Slurm calls ``hpcorch submit`` makes (the pool's reservation, its
nodes, sbatch), without starting an interpreter per job.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from typing import Any

from hpcorch import api
from hpcorch.errors import HpcorchError, SlurmUnavailable
from hpcorch.slurm.factory import make_backend

RETRY_S = 5.0
TRIES = 120
"""While slurmctld does not answer, a submission is tried again every RETRY_S seconds
(for ten minutes), as a user would."""


def _submitted(backend: Any, name: str) -> int:
    """The id of this user's job called ``name`` that Slurm knows (0: none)."""
    me = pwd.getpwuid(os.getuid()).pw_name
    ids = [j.job_id for j in backend.jobs() if j.name == name and j.user == me]
    return min(ids, default=0)


def main() -> int:
    backend = make_backend()
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        job = json.loads(line)
        name = str(job["options"].get("name", "?"))
        for attempt in range(TRIES):
            try:
                if attempt:  # an sbatch slurmctld never answered may still have run
                    found = _submitted(backend, name)
                    if found:
                        print(f"{name} {found}", flush=True)
                        break
                ex = api.Executor(backend, **job["options"])
                handle = ex.submit_script(job["script"], *job["args"])
                print(f"{name} {handle.job_id}", flush=True)
            except SlurmUnavailable:
                if attempt + 1 < TRIES:
                    time.sleep(RETRY_S)
                    continue
                print(f"{name} error Slurm did not answer for {TRIES * RETRY_S:.0f} s", flush=True)
            except HpcorchError as exc:
                print(f"{name} error {str(exc).splitlines()[0]}", flush=True)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
