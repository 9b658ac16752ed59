"""The GPT example (examples/train_gpt.py) and the GPU check's CPU-side parts: a resumed run
equals an uninterrupted one bit for bit; the check skips without CUDA; its report renders."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.runtime.harness import REPO, events, last_step, launch, wait_for

GPT = REPO / "examples" / "train_gpt.py"
ARGS = ["--preset", "tiny", "--samples", "256", "--global-batch", "16", "--max-micro-batch",
        "8", "--max-steps", "12", "--deterministic", "--log-every", "0"]  # fmt: skip


def _state(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, weights_only=True)
    flat = {f"model.{k}": v for k, v in state["model"].items()}
    for pid, s in state["optimizer"]["state"].items():
        flat |= {f"adamw.{pid}.{k}": v for k, v in s.items()}
    return flat


@pytest.mark.slow
def test_gpt_example_stopped_and_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    run = launch(1, a, [*ARGS, "--save-state", str(tmp_path / "a.pt")], script=GPT)
    assert run.wait() == [0], run.stderr()
    run = launch(1, b, [*ARGS, "--save-state", str(tmp_path / "b.pt")], script=GPT)
    wait_for(lambda: last_step(b) >= 4, timeout=120)
    run.signal(signal.SIGUSR2, ranks=(0,))
    assert run.wait() == [75], run.stderr()
    stopped = events(b, "checkpoint")[-1]["step"]
    assert isinstance(stopped, int) and 4 <= stopped < 12
    run = launch(1, b, [*ARGS, "--save-state", str(tmp_path / "b.pt")], script=GPT)
    assert run.wait() == [0], run.stderr()
    sa, sb = _state(tmp_path / "a.pt"), _state(tmp_path / "b.pt")
    assert sa.keys() == sb.keys() and any(k.startswith("adamw.") for k in sa)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert [e["loss"] for e in events(a, "steps")][-3:] == [e["loss"] for e in events(b, "steps")][
        -3:
    ]


def test_gpu_check_is_skipped_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0
    assert (
        out.stdout.strip()
        == "gpu_check: no CUDA device: skipped (use --cpu for a tiny run on CPUs)"
    )


def test_gpu_report_renders_the_committed_results() -> None:
    path = REPO / "benchmarks" / "gpu_report.py"
    spec = importlib.util.spec_from_file_location("gpu_report", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_report"] = mod  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    res = json.loads((REPO / "benchmarks" / "results" / "gpu_h100.json").read_text())
    text = mod.report(res)
    assert "| 128 | 139.4 ms | 140.4 ms |" in text  # the runtime's step time, two runs
    assert "| 128 | 60.5 ms | 139.0 ms | 140.4 ms | 142.0 ms |" in text  # before / after the fix
    assert res["resume"]["identical"] and res["resume"]["backend"] == "nccl"
    # the throughput model refitted from the committed measurements gives the same figures
    again = mod.model_fit(res["sweep_repeat"]["points"])
    for new, old in zip(again, res["sweep_repeat"]["model_fit"], strict=True):
        predicted = [x["predicted"] for x in old["rows"]]
        assert [x["predicted"] for x in new["rows"]] == pytest.approx(predicted, rel=1e-9)
