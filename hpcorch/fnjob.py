"""The training script of a job submitted as a Python function (hpcorch/api.py).

The job wrapper runs this file on every task (one per GPU, as any training script): it
loads the function and its arguments from ``$HPCORCH_JOB_DIR/function.pkl``, calls it, and
rank 0 writes what it returned (or the exception it raised, as text) to
``$HPCORCH_JOB_DIR/result.pkl``, atomically. Exit code: 0, or 1 when the function raised.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any

PAYLOAD_FILE = "function.pkl"
RESULT_FILE = "result.pkl"


def _dumps(obj: Any) -> bytes:
    try:
        import cloudpickle  # type: ignore[import-not-found,import-untyped,unused-ignore]

        return bytes(cloudpickle.dumps(obj))
    except ImportError:
        return pickle.dumps(obj)


def payload(fn: Any, args: Any, kwargs: Any, sys_path: list[str]) -> bytes:
    """What the job loads: the submitter's import path (so that the function's module
    imports in the job), then the pickled call, unpickled only once that path is set."""
    return pickle.dumps({"sys_path": sys_path, "call": _dumps((fn, args, kwargs))})


def write_result(job_dir: Path, doc: dict[str, Any]) -> None:
    tmp = job_dir / (RESULT_FILE + ".tmp")
    try:
        data = _dumps(doc)
    except Exception as exc:  # an unpicklable return value: report it, as a failure
        data = pickle.dumps(
            {"ok": False, "error": f"the function's result cannot be pickled: {exc!r}", "tb": ""}
        )
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, job_dir / RESULT_FILE)


def main() -> int:
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p != here]  # hpcorch's modules are no top-level names
    job_dir = Path(os.environ.get("HPCORCH_JOB_DIR", "."))
    rank = int(os.environ.get("RANK", "0") or 0)
    try:
        with open(job_dir / PAYLOAD_FILE, "rb") as fh:
            payload = pickle.load(fh)  # plain data: the submitter's path, then the call
        for entry in reversed(payload.get("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        fn, args, kwargs = pickle.loads(payload["call"])
        value = fn(*args, **kwargs)
    except BaseException as exc:  # report every failure, SystemExit included
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            value = None
        else:
            if rank == 0:
                write_result(
                    job_dir,
                    {
                        "ok": False,
                        "error": f"{type(exc).__name__}: {exc}",
                        "tb": traceback.format_exc(),
                    },
                )
            print(f"hpcorch-fn: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
            return code
    if rank == 0:
        write_result(job_dir, {"ok": True, "value": value})
    return 0


if __name__ == "__main__":
    sys.exit(main())
