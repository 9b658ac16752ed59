"""The contract between the controller, the job wrapper and the in-job runtime.

Everything that crosses a process boundary is named here once: exit codes, environment
variables and the files in a job's directory. Pure constants; imports nothing.
"""

from __future__ import annotations

# --- exit codes of a training process (and of the job wrapper) -----------------------
EXIT_DONE = 0
"""Training finished."""
EXIT_FAILED = 1
"""Training failed; any code that is neither EXIT_DONE nor EXIT_RELAUNCH means failure."""
EXIT_RELAUNCH = 75
"""Checkpointed at a safe point on request: relaunch me (possibly at another size).

75 is EX_TEMPFAIL from sysexits.h: a temporary condition, try again later."""
EXIT_CONFIG = 78
"""Bad input (plan or checkpoint file unreadable, wrong version, from another job).

A failure that a relaunch cannot fix; 78 is EX_CONFIG from sysexits.h."""
EXIT_STORAGE = 74
"""The job directory cannot be written: no space left, a read-only filesystem, permission
denied or a quota. A lasting condition, not a crash: the runtime says so in one line and
exits with this code, and the controller backs off before it tries the job again (and
gives up after a bounded number of tries). 74 is EX_IOERR from sysexits.h."""
EXIT_LAUNCH_LOST = 79
"""This launch lost a node or a rank, or a newer launch of the same job owns its directory
(``LAUNCH_FILE``): nothing it did is a result. Slurm has usually requeued the job already;
the wrapper never turns such a launch into a success, and an old launch's ranks stop with
this code without writing anything once they find themselves superseded."""
EXIT_UNPLANNED = 77
"""Under the controller, this launch has no plan from it: Slurm started the job without the
controller (its owner or an admin released it). The wrapper runs nothing and exits with this
code; the controller holds the job again and starts it itself, never counting it as a try.
77 is EX_NOPERM from sysexits.h."""
EXIT_CODES = {
    EXIT_DONE: "done",
    EXIT_RELAUNCH: "checkpointed, relaunch me",
    EXIT_STORAGE: "job directory not writable",
    EXIT_CONFIG: "bad plan, checkpoint or settings",
    EXIT_LAUNCH_LOST: "launch lost or superseded",
    EXIT_UNPLANNED: "started without the controller's plan",
}
"""The codes with a meaning of their own; anything else (non-zero) is a failure."""

# --- signals ----------------------------------------------------------------------------
CHECKPOINT_SIGNAL = "USR2"
"""Default signal that asks a job to checkpoint at its next step boundary and exit.

NCCL uses SIGUSR1 internally, so hpcorch uses SIGUSR2."""
SIGNAL_LEAD_S = 120
"""How long before a launch's time limit Slurm sends it the checkpoint signal
(``--signal=B:USR2@120`` in the batch script hpcorch renders)."""

# --- environment variables set by the job wrapper -------------------------------------
ENV_JOB_DIR = "HPCORCH_JOB_DIR"
"""Directory of this hpcorch job: plan, metrics, checkpoints, logs."""
ENV_PLAN = "HPCORCH_PLAN"
"""Path of the plan file (JSON) for the current launch."""
ENV_GLOBAL_BATCH = "HPCORCH_GLOBAL_BATCH"
ENV_PER_GPU_BATCH = "HPCORCH_PER_GPU_BATCH"
ENV_ACCUM_STEPS = "HPCORCH_ACCUM_STEPS"
ENV_MAX_PER_GPU_BATCH = "HPCORCH_MAX_PER_GPU_BATCH"
ENV_MIN_GLOBAL_BATCH = "HPCORCH_MIN_GLOBAL_BATCH"
ENV_MAX_GLOBAL_BATCH = "HPCORCH_MAX_GLOBAL_BATCH"
"""Bounds on the global batch; the runtime clamps any plan into them."""
ENV_LAUNCH = "HPCORCH_LAUNCH"
"""Launch counter of this job: Slurm's restart count (0 for the first launch, +1 per
relaunch), as in the plan, heartbeat, metrics and launch files. Every message numbers
launches from 1 (launch HPCORCH_LAUNCH + 1), as ``hpcorch status``, ``describe`` and
``logs --launch`` do."""
ENV_QUIET_RELAUNCH = "HPCORCH_QUIET_RELAUNCH"
"""Set to 1 by the job wrapper: the runtime's tasks exit 0, not EXIT_RELAUNCH, after a
checkpoint on request, once rank 0's heartbeat of this launch says "exit 75" (the wrapper
reads it there). Slurm's accounting then shows no failed step for a resize."""
ENV_CKPT_SIGNAL = "HPCORCH_CKPT_SIGNAL"
"""Signal name(s) that request a safe-point checkpoint, comma separated (default USR2)."""
ENV_JOB_ID = "HPCORCH_JOB_ID"
"""Identity of the hpcorch job; a checkpoint written by another job is refused."""
ENV_LAUNCHER = "HPCORCH_LAUNCHER"
"""How the runtime forms its process group: auto, env (torchrun), slurm or mpi."""
ENV_CKPT_INTERVAL = "HPCORCH_CKPT_INTERVAL"
"""Seconds between periodic checkpoints (0 or unset: only on signal and at the end)."""
ENV_CPUS_PER_GPU = "HPCORCH_CPUS_PER_GPU"
"""CPUs the job has with each GPU in this launch (data-loading workers + the trainer)."""
ENV_METRICS_INTERVAL = "HPCORCH_METRICS_INTERVAL"
"""Least seconds between two metrics lines (default 5)."""
ENV_TIME_BUDGET = "HPCORCH_TIME_BUDGET"
"""Seconds of run time the job may use across all its launches (unset: no budget)."""
ENV_MAX_RELAUNCHES = "HPCORCH_MAX_RELAUNCHES"
"""Relaunches allowed after the job checkpointed on its own, e.g. at its time limit."""
DEFAULT_MAX_RELAUNCHES = 3
"""The cap on such relaunches when the user sets none (as submitit's default)."""
BUDGET_FILE = "time-used"
"""In a standalone job's directory: 'RELAUNCHES SECONDS' used so far (the wrapper's)."""
ENV_TASK_START_TIMEOUT = "HPCORCH_TASK_START_TIMEOUT"
"""Seconds srun may wait for its step's tasks to start before the launch is stopped as no
result (exit 79; the job wrapper's default 300, 0: no limit)."""
TASK_STARTED_FILE = "task-started"
"""In the job directory: the number of the launch whose rank 0 started (the wrapper's task
shim writes it as the task starts)."""

# --- the sidecar: a training script that does not use the runtime ----------------------
ENV_MODE = "HPCORCH_MODE"
"""managed (the script uses hpcorch.runtime) or sidecar (the wrapper stops and restarts it)."""
ENV_STOP_SIGNAL = "HPCORCH_STOP_SIGNAL"
"""Signal the sidecar sends the script to make it stop (default TERM)."""
ENV_STOP_COMMAND = "HPCORCH_STOP_COMMAND"
"""A shell command the sidecar runs instead of sending the stop signal."""
ENV_STOP_GRACE = "HPCORCH_STOP_GRACE"
"""Seconds the script has to exit after the stop signal before it is killed."""
ENV_SCRIPT_CKPT_DIR = "HPCORCH_SCRIPT_CKPT_DIR"
"""Where the script writes its own checkpoints."""
ENV_RESUME_ARGS = "HPCORCH_RESUME_ARGS"
"""JSON list of arguments appended to the script's on a relaunch ({ckpt}, {ckpt_dir})."""
ENV_RESUME_CMD = "HPCORCH_RESUME_CMD"
"""JSON list: the command that replaces the script's on a relaunch ({ckpt}, {ckpt_dir})."""
ENV_PROGRESS_REGEX = "HPCORCH_PROGRESS_REGEX"
"""Regular expression over the script's output that reports its step (and total)."""
ENV_PROGRESS_FILE = "HPCORCH_PROGRESS_FILE"
"""A JSON-lines file the script writes its progress to ({"step": ..., "total": ...})."""
ENV_BATCH_FILE = "HPCORCH_BATCH_FILE"
"""The sidecar's batch file ({"global_batch", "per_gpu_batch", "accum_steps", "gpus", ...}),
rewritten when the controller changes the global batch of a running launch; a script
submitted with --live-batch applies it from its next step."""
BATCH_FILE = "batch.json"
MODES = ("managed", "sidecar")
SIDECAR_STATE_FILE = "sidecar.json"
REQUEUE_REQUEST_FILE = "requeue-requested"
"""Written when a script asks Slurm to requeue its own job under the controller."""
DEFAULT_STOP_SIGNAL = "TERM"
DEFAULT_STOP_GRACE_S = 60

# --- files in a job directory -----------------------------------------------------------
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
HEARTBEAT_FILE = "heartbeat"
LAUNCH_FILE = "launch"
"""Which launch owns the job directory: ``<slurm job id> <launch>``, written by the job
wrapper under an exclusive flock before it starts the tasks; the runtime writes only while
it holds a shared flock and is the owner (hpcorch/runtime/fence.py)."""
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "ckpt-"
CHECKPOINT_SUFFIX = ".pt"
TMP_SUFFIX = ".tmp"
"""A file being written; renamed to its final name only once complete and fsynced."""

# --- file format versions ------------------------------------------------------------------
PLAN_VERSION = 1
CHECKPOINT_FORMAT = "hpcorch-checkpoint"
CHECKPOINT_VERSION = 1
JOB_SPEC_FILE = "job.json"
BATCH_SCRIPT_FILE = "job.sbatch"

# --- Slurm conventions -------------------------------------------------------------------
JOB_COMMENT_TAG = "hpcorch"
"""Every job hpcorch submits carries a Slurm comment starting with this tag."""
ENV_SPOOL = "HPCORCH_SPOOL"
"""The controller's spool: it writes each job's plan to <spool>/<Slurm job id>/plan.json."""

# --- bounds on what users give: submit checks them, the controller refuses what is outside --
MAX_GPUS = 65536
"""Most GPUs a job may ask for (min, max, pin)."""
MAX_GLOBAL_BATCH = 2**31 - 1
"""Largest global (and per-GPU) batch size."""
MAX_CPUS_PER_GPU = 1024
MAX_GRACE_S = 7 * 86400
"""Longest grace period of a sidecar job's stop."""
MAX_PATH_LENGTH = 1024
"""Longest job directory the controller accepts."""
MAX_DECLARED_EPOCHS = 10**6
"""Most epochs a job may declare (``hpcorch submit --epochs``, comment tag ``epochs=``)."""
MAX_DECLARED_SAMPLES = 10**12
"""Most samples per epoch a job may declare (``--dataset-size``, comment tag ``dataset=``)."""
