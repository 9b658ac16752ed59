"""hpcorch from Python (a notebook, a sweep script), in the spirit of submitit.

    from hpcorch import api

    ex = api.Executor(min_gpus=2, max_gpus=8, pool="hpcorch", account="proj", time="4:00:00")
    job = ex.submit_script("train.py", "--epochs", "20")   # a training script
    job = ex.submit(train, lr=0.1)                           # a function, run on every GPU task
    job.state, job.phase, job.gpus, job.batch_size           # as `hpcorch status` shows them
    print(job.logs())                                        # every launch's output
    job.wait(); job.result()                                 # the function's return value
    job.cancel()
    api.Job(1234)                                            # a handle on a submitted job
    jobs = ex.map_array(train, [0.1, 0.2])                   # one elastic job per item
    for job in api.as_completed(jobs): ...                   # each as it ends
    api.LocalExecutor(min_gpus=1).submit(train, lr=0.1)      # on this machine, no Slurm

The options are those of ``hpcorch submit`` with ``-`` as ``_`` (``min_gpus``, ``account``,
``sbatch_args=["--mem-per-gpu=20G"]``, ``time``/``time_limit``, ``time_total``,
``max_relaunches``, the sidecar options, ...), checked the same way
(hpcorch/request.py): a bad one raises :class:`hpcorch.request.RequestError` with one line.

A function is pickled (with cloudpickle when it is installed: ``pip install
'hpcorch[api]'``, needed for functions defined in a notebook or a ``__main__``) into the job
directory; every task of the job calls it (use ``torch.distributed`` as under torchrun),
and rank 0's return value is written back for :meth:`Job.result`.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcorch import fnjob
from hpcorch.apibase import (
    JobError,
    check_options,
    function_payload,
    job_name_of,
    request_kwargs,
)
from hpcorch.cluster import ENDED_STATES
from hpcorch.errors import HpcorchError
from hpcorch.joblogs import find_job_dir, is_over, launch_slice, log_name, pooled_job
from hpcorch.joblogs import relaunch_overdue as _overdue
from hpcorch.local import LocalExecutor, LocalJob
from hpcorch.paths import STATE_DB, controller_dir, spool_dir
from hpcorch.protocol import METRICS_FILE, PLAN_FILE
from hpcorch.request import RequestError, build_request
from hpcorch.slurm.backend import SlurmBackend
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.parse import SlurmJob
from hpcorch.slurm.script import parse_comment
from hpcorch.submit import submit as _submit

__all__ = [
    "Executor",
    "Job",
    "JobError",
    "LocalExecutor",
    "LocalJob",
    "RequestError",
    "as_completed",
    "submit_function",
    "submit_script",
]


class Executor:
    """Options shared by the jobs it submits (``update`` changes them)."""

    def __init__(self, backend: SlurmBackend | None = None, **options: Any) -> None:
        check_options(options)
        self.options: dict[str, Any] = dict(options)
        self._backend = backend

    def update(self, **options: Any) -> None:
        """Change options; checked at once, as at construction."""
        check_options({**self.options, **options})
        self.options.update(options)

    @property
    def backend(self) -> SlurmBackend:
        if self._backend is None:
            self._backend = make_backend()
        return self._backend

    def submit_script(self, script: str | os.PathLike[str], *args: str) -> Job:
        """Submit a training script with its arguments, as ``hpcorch submit`` does."""
        req = build_request(os.fspath(script), args, **request_kwargs(self.options))
        result = _submit(req, self.backend)
        assert result.slurm_id is not None
        return Job(result.slurm_id, result.job_dir, backend=self.backend)

    def map_array(self, fn: Callable[..., Any], *iterables: Any) -> list[Job]:
        """``fn(*items)`` for each items of ``zip(*iterables)``: one job each (named
        NAME_0, NAME_1, ...), as submitit's map_array; every one is an elastic job the
        controller schedules on its own (no Slurm job array)."""
        return _map_array(self, fn, *iterables)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Job:
        """Submit ``fn(*args, **kwargs)``, called on every task of the job; rank 0's
        return value is what :meth:`Job.result` gives."""
        data = function_payload(fn, args, kwargs)
        opts = dict(self.options)
        if not opts.get("name"):
            opts["name"] = job_name_of(fn)
        req = build_request(fnjob.__file__, (), **request_kwargs(opts))
        result = _submit(req, self.backend, files={fnjob.PAYLOAD_FILE: data})
        assert result.slurm_id is not None
        return Job(result.slurm_id, result.job_dir, backend=self.backend, function=True)


def _map_array(ex: Executor, fn: Callable[..., Any], *iterables: Any) -> list[Job]:
    """One elastic job per item, each scheduled by the controller as any other."""
    items = list(zip(*iterables, strict=True))
    base = ex.options.get("name") or job_name_of(fn, 56)
    jobs = []
    for i, args in enumerate(items):
        sub = Executor(ex._backend, **{**ex.options, "name": f"{base}_{i}"})
        jobs.append(sub.submit(fn, *args))
        ex._backend = sub._backend  # one backend for all
    return jobs


def submit_script(script: str | os.PathLike[str], *args: str, **options: Any) -> Job:
    """``Executor(**options).submit_script(script, *args)``."""
    return Executor(**options).submit_script(script, *args)


def submit_function(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Job:
    """``Executor(**options).submit(fn, *args, **kwargs)``."""
    return Executor(**options).submit(fn, *args, **dict(kwargs or {}))


class Job:
    """A handle on one of hpcorch's jobs (by its Slurm job id). Every property asks Slurm
    afresh (one ``squeue``); none caches."""

    def __init__(
        self,
        job_id: int,
        job_dir: str | os.PathLike[str] | None = None,
        backend: SlurmBackend | None = None,
        function: bool | None = None,
        state_dir: str | None = None,
    ) -> None:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise RequestError(f"a job id is a positive integer, got {job_id!r}")
        self.job_id = job_id
        self.backend = backend or make_backend()
        self._dir = Path(job_dir) if job_dir is not None else None
        self._function = function
        self.state_dir = state_dir
        if self._dir is None and self.job_dir is None:  # as squeue -j: no such job
            raise JobError(f"job {job_id} is known neither to Slurm nor to hpcorch here")

    def __repr__(self) -> str:
        return f"Job({self.job_id}, state={self.state!r})"

    # --- what Slurm and the controller say ---------------------------------------------
    def info(self) -> SlurmJob | None:
        """Slurm's record of the job (None once Slurm no longer lists it)."""
        return next((j for j in self.backend.jobs() if j.job_id == self.job_id), None)

    @property
    def job_dir(self) -> Path | None:
        if self._dir is None:
            self._dir = find_job_dir(self.job_id, self.info())
        return self._dir

    @property
    def state(self) -> str:
        """Slurm's state (PENDING, RUNNING, COMPLETED, ...), or UNKNOWN once Slurm has
        forgotten the job (then see :attr:`phase` or the job directory). A job neither
        Slurm nor a job directory here knows is refused at ``Job(id)``."""
        job = self.info()
        return job.state if job is not None else "UNKNOWN"

    @property
    def phase(self) -> str | None:
        """The controller's phase (queued, running, stopping, done, timeout, ...) for a
        pool job whose controller state is readable here; else None."""
        path = controller_dir(self.state_dir) / STATE_DB
        if not path.exists():
            return None
        from hpcorch.controller.store import Store

        try:
            store = Store(path, readonly=True)
            try:
                rec = store.job(self.job_id)
            finally:
                store.close()
        except HpcorchError:
            return None
        return rec.phase if rec is not None else None

    @property
    def gpus(self) -> int:
        """GPUs the job runs on now (0 while it waits)."""
        job = self.info()
        return job.gpus if job is not None and job.state == "RUNNING" else 0

    @property
    def batch_size(self) -> int | None:
        """The global batch of the current launch: the controller's plan, else what the
        job last reported, else what it was submitted with."""
        directory = self.job_dir
        # a pool job's plan is in the controller's spool; an older job's in its directory
        plans = [spool_dir() / str(self.job_id) / PLAN_FILE]
        if directory is not None:
            plans.append(directory / PLAN_FILE)
        for path in plans:
            try:
                plan = json.loads(path.read_text())
                if isinstance(plan.get("global_batch"), int):
                    return int(plan["global_batch"])
            except (OSError, ValueError, AttributeError):
                pass
        if directory is not None:
            reported = _last_reported_batch(directory / METRICS_FILE)
            if reported:
                return reported
        job = self.info()
        tags = parse_comment(job.comment) if job is not None else None
        batch = (tags or {}).get("batch", "")
        return int(batch) if batch.isascii() and batch.isdigit() else None

    def done(self) -> bool:
        """Ended for good (a pool job between two launches is not done)."""
        job = self.info()
        pooled = pooled_job(job)
        if job is not None and pooled and job.state in ENDED_STATES:
            phase = self.phase
            if phase is not None:
                return phase in ("done", "failed", "cancelled", "lost", "timeout", "left")
            return _overdue(job, time.time())
        return is_over(job, pooled)

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> str:
        """Wait until the job has ended for good; its final Slurm state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id} still {self.state} after {timeout} s")
            time.sleep(poll)
        return self.state

    def logs(self, launch: int | None = None) -> str:
        """The job's output: every launch, or only ``launch`` (1 for the first, as
        ``hpcorch status`` and ``describe`` count)."""
        directory = self.job_dir
        if directory is None:
            raise JobError(f"no job directory for job {self.job_id}")
        try:
            data = (directory / log_name(self.job_id)).read_bytes()
        except FileNotFoundError:
            data = b""
        if launch is not None:
            try:
                data = launch_slice(data, launch)
            except ValueError as exc:
                raise JobError(f"job {self.job_id}: {exc}") from exc
        return data.decode("utf-8", errors="replace")

    def cancel(self) -> None:
        self.backend.cancel(self.job_id)

    def result(self, timeout: float | None = None, poll: float = 2.0) -> Any:
        """A function job's return value (waits for the job); :class:`JobError` with the
        function's traceback when it raised, or when the job ended without a result."""
        directory = self.job_dir
        if directory is None:
            raise JobError(f"no job directory for job {self.job_id}")
        path = directory / fnjob.RESULT_FILE
        if not path.exists():
            state = self.wait(timeout, poll)
            if not path.exists():
                raise JobError(
                    f"job {self.job_id} ended ({state}) without a result: see job.logs()"
                )
        with open(path, "rb") as fh:
            doc = pickle.load(fh)
        if not doc.get("ok"):
            raise JobError(f"job {self.job_id} failed: {doc.get('error')}\n{doc.get('tb', '')}")
        return doc.get("value")


def _last_reported_batch(path: Path) -> int | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("global_batch"), int):
            return int(doc["global_batch"])
    return None


def as_completed(jobs: Iterable[Any], poll: float = 2.0) -> Iterator[Any]:
    """The jobs (of this API or local), each as soon as it has ended for good."""
    left = list(jobs)
    while left:
        for job in [j for j in left if j.done()]:
            left.remove(job)
            yield job
        if left:
            time.sleep(poll)
