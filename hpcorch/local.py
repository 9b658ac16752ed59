"""The Python API's jobs run on this machine, without Slurm: for debugging a training
script or a function before it goes to the pool (submitit's ``LocalExecutor``).

    ex = api.LocalExecutor(min_gpus=1)
    job = ex.submit(train, lr=0.1)         # runs now, in a child process
    job.result()                           # as a Slurm job's result()

A job is one task (rank 0 of a world of 1) with the environment the job wrapper gives a
task (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``,
``HPCORCH_JOB_DIR``), in its own directory under ``$HPCORCH_HOME/jobs``; a function job runs
``hpcorch/fnjob.py`` as it does under Slurm. Options are checked as for the Slurm executor;
those of Slurm (pool, account, time, ...) have no effect here.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcorch import fnjob
from hpcorch.apibase import JobError, check_options, function_payload, job_name_of, name_chars
from hpcorch.errors import HpcorchError
from hpcorch.paths import jobs_dir
from hpcorch.ports import free_port
from hpcorch.request import RequestError

OUTPUT = "output.log"


class LocalJob:
    """A job running (or ended) on this machine: the handle of :class:`hpcorch.api.Job`
    where it makes sense without Slurm."""

    def __init__(self, proc: subprocess.Popen[bytes], job_dir: Path, function: bool) -> None:
        self.proc = proc
        self.job_dir = job_dir
        self.job_id = proc.pid
        self._function = function

    def __repr__(self) -> str:
        return f"LocalJob({self.job_id}, state={self.state!r})"

    @property
    def state(self) -> str:
        """RUNNING, COMPLETED (exit 0), FAILED, or CANCELLED, as Slurm would say."""
        code = self.proc.poll()
        if code is None:
            return "RUNNING"
        if code == 0:
            return "COMPLETED"
        return "CANCELLED" if code < 0 else "FAILED"

    def done(self) -> bool:
        return self.proc.poll() is not None

    def wait(self, timeout: float | None = None, poll: float = 0.2) -> str:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"local job {self.job_id} still running after {timeout} s") from None
        return self.state

    def logs(self) -> str:
        try:
            return (self.job_dir / OUTPUT).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def result(self, timeout: float | None = None, poll: float = 0.2) -> Any:
        """The function's return value; :class:`hpcorch.api.JobError` as for a Slurm job."""
        state = self.wait(timeout, poll)
        path = self.job_dir / fnjob.RESULT_FILE
        if not path.exists():
            raise JobError(f"local job {self.job_id} ended ({state}) without a result: see logs()")
        with open(path, "rb") as fh:
            doc = pickle.load(fh)
        if not doc.get("ok"):
            raise JobError(
                f"local job {self.job_id} failed: {doc.get('error')}\n{doc.get('tb', '')}"
            )
        return doc.get("value")


class LocalExecutor:
    """Runs jobs on this machine (see the module); options as :class:`hpcorch.api.Executor`."""

    def __init__(self, **options: Any) -> None:
        check_options(options)
        self.options: dict[str, Any] = dict(options)

    def update(self, **options: Any) -> None:
        check_options({**self.options, **options})
        self.options.update(options)

    def submit_script(self, script: str | os.PathLike[str], *args: str) -> LocalJob:
        path = Path(script)
        if not path.is_file():
            raise RequestError(f"script {os.fspath(script)!r} does not exist or is not a file")
        name = name_chars(path.stem)[:64] or "job"
        return self._start([sys.executable, str(path.resolve()), *args], name, False)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> LocalJob:
        data = function_payload(fn, args, kwargs)
        return self._start([sys.executable, fnjob.__file__], job_name_of(fn), True, data)

    def map_array(self, fn: Callable[..., Any], *iterables: Any) -> list[LocalJob]:
        return [self.submit(fn, *items) for items in zip(*iterables, strict=True)]

    def _start(self, argv: list[str], name: str, function: bool, payload: bytes = b"") -> LocalJob:
        label = self.options.get("name") or name
        try:
            base = jobs_dir()
            base.mkdir(parents=True, exist_ok=True)
            job_dir = Path(tempfile.mkdtemp(prefix=f"local-{label}-", dir=base))
            if function:
                (job_dir / fnjob.PAYLOAD_FILE).write_bytes(payload)
            out = open(job_dir / OUTPUT, "wb")  # noqa: SIM115 (the child holds it)
        except OSError as exc:
            raise HpcorchError(f"cannot make a local job directory: {exc}") from exc
        env: Mapping[str, str] = {
            **os.environ,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "HPCORCH_JOB_DIR": str(job_dir),
        }
        with out:
            proc = subprocess.Popen(
                argv, env=dict(env), cwd=os.getcwd(), stdout=out, stderr=subprocess.STDOUT
            )
        return LocalJob(proc, job_dir, function)
