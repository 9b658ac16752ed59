"""The Hugging Face ``Trainer`` as a managed, elastic pool job: one line.

    import hpcorch.integrations.transformers as hpt      # first: holds the signal
    ...
    trainer = Trainer(model=model, args=args, train_dataset=train)
    hpt.elastic(trainer).train()                         # was: trainer.train()

:func:`elastic` adds the :class:`Elastic` callback and gives the ``Trainer`` hpcorch's data
order. Each launch then trains at the global batch of the controller's plan (per-device
batch and gradient accumulation from hpcorch's planner, the script's
``per_device_train_batch_size`` as the most a device takes), reports its start, steps,
throughput and gradient noise scale as the runtime does, and on the checkpoint signal saves
a checkpoint through the Trainer's own machinery (``checkpoint-N`` in ``output_dir``, with
hpcorch's state beside it) at the next step boundary and exits 75. A relaunch at any size
resumes from that checkpoint (``Trainer.train(resume_from_checkpoint=...)``) at the sample
where it stopped. A new global batch at the same GPUs (the controller rewrites the plan) is
taken without a new process: a checkpoint, then ``train`` again at the new batch.

Exactness: the samples form one stream, epoch after epoch, each epoch a seeded permutation
independent of the world size; every optimizer step takes the next global-batch samples of
it (a step may take the end of one epoch and the start of the next). A resume at another
world size or batch continues at the exact sample: none is skipped or repeated, except in
the job's very last step when it has fewer samples than ranks (W ranks: at most W - 1
samples of that step are trained twice; with a per-device batch of 1, also when they are no
multiple of W).
"""

from __future__ import annotations

import hpcorch.runtime  # noqa: F401  (first: holds the checkpoint signal while torch loads)

# isort: split
import gc
import json
import math
import os
import time
import types
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_pt_utils import BatchRebalanceSampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

from hpcorch.integrations.core import ElasticRun, joined_group, settle, state_problem
from hpcorch.integrations.layout import count_steps
from hpcorch.planner import BatchPlan
from hpcorch.protocol import ENV_GLOBAL_BATCH, EXIT_RELAUNCH

STATE_FILE = "hpcorch-state.json"
"""hpcorch's state in a Trainer checkpoint directory, written last: it marks the directory
complete (a Trainer killed while it saved leaves none)."""

__all__ = ["STATE_FILE", "Elastic", "elastic"]


class _StepSampler(BatchRebalanceSampler):
    """This rank's micro-batches, already split between the ranks (the Trainer passes a
    ``BatchRebalanceSampler`` to the data loader as its batch sampler, unsharded). The first
    ``skip`` are placeholders the Trainer skips unread when it resumes."""

    def __init__(self, run: ElasticRun, total: int, skip: int) -> None:
        self.run, self.total, self.skip = run, total, skip
        plan = run.layout_plan
        steps = count_steps(run.dataset_size, run.position, plan.global_batch, total)
        last = total - run.samples_done - (steps - 1) * plan.global_batch
        short = -(-last // (plan.gpus * plan.micro_batch)) if last < plan.global_batch else 0
        self.steps = steps
        self.length = skip + (steps - 1) * plan.accum_steps + (short or plan.accum_steps)

    def __iter__(self) -> Any:
        for _ in range(self.skip):
            yield [0]
        yield from self.run.micro_batches(self.run.position, total=self.total)

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        pass  # the order is hpcorch's: one stream over the epochs


class Elastic(TrainerCallback):
    """The Trainer's hooks into the launch; :func:`elastic` adds it."""

    def __init__(self, trainer: Trainer, run: ElasticRun, total: int, epochs: int) -> None:
        self.trainer = trainer
        self.run = run
        self.total = total
        self.epochs = epochs
        self.stopping = False
        self.new_batch: BatchPlan | None = None
        self._reported = False
        self._loss_before: float | None = None
        self._save_asked = 0.0

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.run.attach(self.trainer.model_wrapped, self.trainer.optimizer)
        if not self._reported:  # once per launch: a rebatch trains on in the same launch
            self._reported = True
            self.run.report_begin(self.trainer.model, self.epochs)
        self.run.restart_clock()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.run.step_begin()
        self._loss_before = self._tr_loss()

    def _tr_loss(self) -> float | None:
        """The Trainer's own running loss sum on this rank (reset when it logs)."""
        value = getattr(self.trainer, "_tr_loss", None)
        return float(value) if isinstance(value, torch.Tensor) else None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        run = self.run
        last = run.samples_done + (run.current.size if run.current else 0) >= self.total
        now = self._tr_loss()
        before = self._loss_before
        # the Trainer's loss of this step on this rank; its mean over the ranks is the step's
        loss = (now - before) / run.world_size if now is not None and before is not None else None
        agreed = run.step_end(loss=loss, last=last)
        state.epoch = run.position[0] + run.position[1] / run.dataset_size
        self._save_asked = time.perf_counter()
        if last:
            control.should_save = True  # the final checkpoint: a requeued job trains no more
        elif agreed.stop:
            self.stopping = True
            control.should_save = control.should_training_stop = True
        elif agreed.batch is not None:  # checkpoint, then train() again at the new batch
            self.new_batch = agreed.batch
            control.should_save = control.should_training_stop = True
        elif agreed.save:
            control.should_save = True

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.run.restart_clock()  # an evaluation is no training step's time

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        """After every checkpoint the Trainer saves: hpcorch's state in it, last."""
        run = self.run
        folder = Path(self.trainer._get_output_dir(trial=None)) / (
            f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        )
        path = folder / STATE_FILE
        size = [0]
        if run.is_main and state.global_step == run.global_step:
            body = (json.dumps(run.state_dict()) + "\n").encode()

            def write() -> None:
                size[0] = _commit(folder, path, body)

            run.gate.write(path, write)
        run.stop_on_failure()
        seconds = time.perf_counter() - self._save_asked
        reason = "signal" if self.stopping else "trainer"
        run.checkpointed(reason, run.global_step, folder, size[0], seconds)
        if self.stopping:
            run.exit(EXIT_RELAUNCH, run.global_step)
        run.restart_clock()


def _commit(folder: Path, path: Path, body: bytes) -> int:
    """Make the Trainer's files durable, then write hpcorch's state atomically."""
    total = 0
    for f in folder.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            total += f.stat().st_size
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return total + len(body)


def newest_checkpoint(
    output_dir: Path, job_id: str | None, dataset_size: int
) -> tuple[Path, dict[str, Any]] | None:
    """The newest ``checkpoint-N`` of ``output_dir`` that holds hpcorch's state for this job."""
    found = []
    for d in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = d.name.rsplit("-", 1)[1]
        if step.isdigit() and (d / STATE_FILE).is_file():
            found.append((int(step), d))
    for _, d in sorted(found, reverse=True):
        try:
            state = json.loads((d / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not state_problem(state, job_id, dataset_size):
            return d, state
    return None


def elastic(
    trainer: Trainer,
    *,
    max_micro_batch: int | None = None,
    lr_scaling: str = "none",
    warmup_steps: int = 0,
) -> Trainer:
    """Make ``trainer`` a managed, elastic job (see the module); returns it.

    ``max_micro_batch``: the most samples a device takes in one pass (default: the
    script's ``per_device_train_batch_size``; ``hpcorch submit --max-per-gpu-batch`` and the
    plan override it). ``lr_scaling``: none (default: the Trainer's schedule as it is),
    linear, sqrt or adascale, the optimizer's LR taken as tuned for the script's own global
    batch, ramped over ``warmup_steps`` after every change of it.
    """
    args = trainer.args
    if trainer.train_dataset is None or not hasattr(trainer.train_dataset, "__len__"):
        raise ValueError("hpcorch needs a train_dataset with a length (a map-style dataset)")
    if args.save_only_model:
        raise ValueError(
            "hpcorch resumes optimizer and scheduler too: save_only_model must be False"
        )
    world = max(1, args.world_size)
    own = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    script_batch = int(os.environ.get(ENV_GLOBAL_BATCH) or 0) or own
    micro = max_micro_batch or args.per_device_train_batch_size
    info = joined_group(args.device, "trainer")
    settings = settle(info, global_batch=script_batch, max_micro_batch=micro, lr_scaling=lr_scaling)
    n = len(trainer.train_dataset)
    run = ElasticRun(
        info,
        settings,
        framework="transformers",
        dataset_size=n,
        seed=args.data_seed if args.data_seed is not None else args.seed,
        shuffle=True,
        base_batch=script_batch,
        warmup_steps=warmup_steps,
    )
    if args.max_steps > 0:
        total = args.max_steps * script_batch
    else:
        total = math.ceil(args.num_train_epochs * n)
    callback = Elastic(trainer, run, total, max(1, math.ceil(total / n)))
    trainer.add_callback(callback)
    args.ignore_data_skip = False  # the Trainer skips the placeholders of a resume
    original = trainer.train
    state: dict[str, Any] = {"skip": 0}

    def train_sampler(self: Trainer, train_dataset: Any = None) -> _StepSampler:
        return _StepSampler(run, total, state["skip"])

    def train(self: Trainer, resume_from_checkpoint: Any = None, **kw: Any) -> TrainOutput:
        if resume_from_checkpoint not in (None, False):
            run.log("resume_from_checkpoint is ignored: hpcorch resumes from its own checkpoints")
        ckpt = _agreed_checkpoint(run, Path(self._get_output_dir(trial=None)))
        out = None
        while True:
            plan = run.layout_plan
            _set_batch(self, plan)
            steps = count_steps(n, run.position, plan.global_batch, total)
            if steps == 0:
                run.log("training was finished: nothing left to train")
                break
            state["skip"] = run.global_step * plan.accum_steps
            args.max_steps = run.global_step + steps
            out = original(resume_from_checkpoint=str(ckpt) if ckpt else None, **kw)
            if callback.new_batch is None:
                break
            new, callback.new_batch = callback.new_batch, None
            run.rebatch(new, run.global_step)
            run.layout_plan = new
            ckpt = (
                Path(self._get_output_dir(trial=None))
                / f"{PREFIX_CHECKPOINT_DIR}-{run.global_step}"
            )
            _unwrap(self)
        run.done(run.global_step)
        return out or TrainOutput(run.global_step, 0.0, {})

    patched = cast(Any, trainer)  # on this instance: its own sampler, and train() around it
    patched._get_train_sampler = types.MethodType(train_sampler, trainer)
    patched.train = types.MethodType(train, trainer)
    return trainer


def _agreed_checkpoint(run: ElasticRun, output_dir: Path) -> Path | None:
    """Collective: the checkpoint rank 0 found, for every rank; hpcorch's state taken."""
    found = (
        newest_checkpoint(output_dir, run.settings.job_id, run.dataset_size)
        if run.is_main
        else None
    )
    box: list[Any] = [[str(found[0]), found[1]] if found else None]
    if run.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        return None
    path, state = Path(box[0][0]), box[0][1]
    run.load_state_dict(state, str(path / STATE_FILE))
    epoch, offset = run.position
    run.log(f"resuming from {path} at step {run.global_step} (epoch {epoch}, sample {offset})")
    return path


def _set_batch(trainer: Trainer, plan: BatchPlan) -> None:
    """The planned split as the Trainer's own settings."""
    trainer.args.per_device_train_batch_size = plan.micro_batch
    trainer.args.gradient_accumulation_steps = plan.accum_steps
    trainer._train_batch_size = plan.micro_batch
    trainer.accelerator.gradient_accumulation_steps = plan.accum_steps


def _unwrap(trainer: Trainer) -> None:
    """Before ``train`` runs again in this process: the model and optimizer as the Trainer
    first had them (it wraps them again, and loads their state from the checkpoint)."""
    t = cast(Any, trainer)
    t.model_wrapped = trainer.model
    opt: Any = trainer.optimizer
    while isinstance(getattr(opt, "optimizer", None), torch.optim.Optimizer):
        opt = opt.optimizer
    t.optimizer = opt
    if getattr(trainer, "_created_lr_scheduler", False):
        trainer.lr_scheduler = None
    gc.collect()  # the old DDP wrapper and its gradient hooks go now
