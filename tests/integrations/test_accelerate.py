"""The path hpcorch recommends for a plain Accelerate loop: the runtime for the elastic
part, the ``Accelerator`` (made after ``hr.init``, on the runtime's process group) for
device and autocast. Two ranks stopped by the signal to one of them, resumed on one: every
sample of every epoch trained exactly once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from hpcorch.protocol import EXIT_DONE, EXIT_RELAUNCH
from tests.runtime.harness import REPO, events, launch, signal_at

pytestmark = pytest.mark.slow
SCRIPT = REPO / "examples" / "train_accelerate.py"


def test_accelerate_loop_on_the_runtime_resumes_exactly_at_another_size(tmp_path: Path) -> None:
    jd = tmp_path / "job"
    jd.mkdir()
    args = ["--samples", "512", "--epochs", "2", "--record", str(jd / "seen")]
    run = launch(2, jd, [*args, "--step-delay", "0.05"], script=SCRIPT)
    signal_at(run, jd, 3, ranks=[1])
    assert run.wait() == [EXIT_RELAUNCH, EXIT_RELAUNCH], run.stderr()
    one = launch(1, jd, args, script=SCRIPT)
    assert one.wait() == [EXIT_DONE], one.stderr()
    starts = events(jd, "start")
    assert [(s["gpus"], s["resumed"]) for s in starts] == [(2, False), (1, True)]
    assert starts[1]["accum_steps"] == 4  # 64 = 16 x 4 on one rank
    seen: Counter[tuple[int, int]] = Counter()
    for f in jd.glob("seen.*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            seen.update((rec["epoch"], i) for i in rec["idx"])
    assert seen == Counter((e, i) for e in range(2) for i in range(512))
