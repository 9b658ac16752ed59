"""Tables of benchmarks/gpu_check.py's results, and the throughput model's predictions.

python benchmarks/gpu_report.py benchmarks/results/gpu_h100.json
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DETERMINISM = {
    "torch.use_deterministic_algorithms": True,
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "torch.backends.cudnn.deterministic": True,
    "torch.backends.cudnn.benchmark": False,
    "tf32": "off (torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32)",
    "attention": "math SDPA kernel (the flash and memory-efficient backwards add atomically)",
    "seeds": "torch.manual_seed(0) before the model is built; runtime seed 0 (data order); "
    "the runtime saves and restores every RNG state (Python, NumPy, torch CPU, CUDA)",
}


def compare_states(a: Path, b: Path) -> dict[str, Any]:
    import torch

    sa, sb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    tensors = equal = 0
    max_diff = 0.0
    differing: list[str] = []

    def walk(x: Any, y: Any, where: str) -> None:
        nonlocal tensors, equal, max_diff
        if isinstance(x, torch.Tensor):
            tensors += 1
            if x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y):
                equal += 1
            else:
                if x.is_floating_point():
                    max_diff = max(max_diff, float((x.double() - y.double()).abs().max()))
                if len(differing) < 5:
                    differing.append(where)
        elif isinstance(x, dict):
            for k in x:
                walk(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, list | tuple):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{where}[{i}]")
        elif x != y and len(differing) < 5:
            differing.append(where)

    walk(sa, sb, "state")
    return {
        "tensors": tensors,
        "bitwise_equal": equal,
        "identical": equal == tensors and not differing,
        "max_abs_diff": max_diff,
        "first_differing": differing,
    }


@dataclass(frozen=True)
class Measured:
    """One single-GPU measurement as the throughput model takes it (StepLike)."""

    micro_batch: int
    step_time: float
    nodes: int = 1
    gpus: int = 1
    sync_time: float = 0.0


def model_fit(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Predictions of hpcorch/model/throughput.py from subsets of the measured curve."""
    import numpy as np

    from hpcorch.model.throughput import ThroughputModel

    ok = [p for p in points if "step_time" in p]
    subsets = [ok[:2], ok[:3]]  # the first two or three measurements
    middle = [p for p in ok if 16 <= p["per_gpu_batch"] <= 64]
    if len(middle) >= 2 and len(ok) > len(middle) + 2:
        subsets.append(middle)
    fits = []
    for used in subsets:
        name = ", ".join(str(p["per_gpu_batch"]) for p in used)
        model = ThroughputModel(Measured(p["per_gpu_batch"], p["step_time"]) for p in used)
        rows = []
        for p in ok:
            b = p["per_gpu_batch"]
            pred = float(
                model.iteration_time(np.array([1]), np.array([1]), np.array([b]), np.array([1]))[0]
            )
            rows.append(
                {
                    "per_gpu_batch": b,
                    "measured": p["step_time"],
                    "predicted": pred,
                    "error": pred / p["step_time"] - 1,
                    "fitted_on": b in [u["per_gpu_batch"] for u in used],
                }
            )
        unseen = [abs(x["error"]) for x in rows if not x["fitted_on"]]
        fits.append(
            {
                "fitted_on": name,
                "rows": rows,
                "mean_abs_error_unseen": statistics.mean(unseen) if unseen else None,
                "max_abs_error_unseen": max(unseen) if unseen else None,
            }
        )
    return fits


def _fmt_point(p: dict[str, Any]) -> str:
    if "error" in p:
        return f"error {p['error']}"
    mem = p.get("max_memory_allocated")
    return (
        f"runtime step time {p['step_time'] * 1e3:.1f} ms, wall {p['wall_per_step'] * 1e3:.1f}"
        f" ms/step, memory {mem / 2**30 if mem else 0:.2f} GiB"
    )


# --- report -------------------------------------------------------------------------------
def _ms(x: float | None) -> str:
    return f"{x * 1e3:.1f} ms" if x is not None else "-"


def _by_batch(points: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {p["per_gpu_batch"]: p for p in points}


def step_table(res: dict[str, Any]) -> list[str]:
    keys = [k for k in ("sweep", "sweep_repeat", "sweep_final") if res.get(k, {}).get("points")]
    runs = [_by_batch(res[k]["points"]) for k in keys]
    plain = _by_batch(res.get("plain", {}).get("plain", []))
    ddp = _by_batch(res.get("plain", {}).get("ddp", []))
    batches = sorted({b for r in runs for b in r})
    head = [f"runtime, run {i + 1}" for i in range(len(runs))]
    if plain:
        head += ["plain loop", "plain DDP loop", "host time of a plain step"]
    head += ["memory allocated"] + [f"reserved, run {i + 1}" for i in range(len(runs))]
    out = ["| per-GPU batch | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for b in batches:
        pts = [r.get(b, {}) for r in runs]
        cells = [_ms(x.get("step_time")) if "error" not in x else x["error"] for x in pts]
        if plain:
            cells += [_ms(plain.get(b, {}).get("pipelined")), _ms(ddp.get(b, {}).get("pipelined")),
                      _ms(plain.get(b, {}).get("host"))]  # fmt: skip
        alloc = next((x["max_memory_allocated"] for x in pts if x.get("max_memory_allocated")), 0)
        cells.append(f"{alloc / 2**30:.1f} GiB")
        cells += [f"{x['max_memory_reserved'] / 2**30:.1f} GiB" if x.get("max_memory_reserved")
                  else "-" for x in pts]  # fmt: skip
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    return out


def fit_table(sweep: dict[str, Any]) -> list[str]:
    fits = sweep.get("model_fit", [])
    if not fits:
        return []
    names = [f["fitted_on"] for f in fits]
    out = ["| per-GPU batch | measured | " + " | ".join(f"fitted on {n}" for n in names) + " |",
           "|---" * (len(names) + 2) + "|"]  # fmt: skip
    for k, row in enumerate(fits[0]["rows"]):
        cells = []
        for f in fits:
            x = f["rows"][k]
            fitted = " (fit)" if x["fitted_on"] else ""
            cells.append(f"{_ms(x['predicted'])} ({x['error'] * 100:+.0f}%){fitted}")
        out.append(
            f"| {row['per_gpu_batch']} | {_ms(row['measured'])} | " + " | ".join(cells) + " |"
        )
    mean = [f["mean_abs_error_unseen"] for f in fits]
    out.append(
        "| mean abs. error, unfitted | | " + " | ".join(f"{m * 100:.0f}%" for m in mean) + " |"
    )
    return out


def timing_table(res: dict[str, Any]) -> list[str]:
    old = res.get("old_timing", {}).get("points", [])
    runs = {1: _by_batch(res.get("sweep", {}).get("points", [])),
            2: _by_batch(res.get("sweep_repeat", {}).get("points", []))}  # fmt: skip
    out = ["| per-GPU batch | before the fix: reported | wall time per step | after: reported "
           "| wall time per step |", "|---|---|---|---|---|"]  # fmt: skip
    for p in old:
        n = runs.get(p.get("run", 1), {}).get(p["per_gpu_batch"], {})
        out.append(f"| {p['per_gpu_batch']} | {_ms(p.get('step_time'))} | "
                   f"{_ms(p.get('wall_per_step'))} | {_ms(n.get('step_time'))} | "
                   f"{_ms(n.get('wall_per_step'))} |")  # fmt: skip
    return out


def checkpoint_table(ck: dict[str, Any]) -> list[str]:
    out = ["| | checkpoint | write | torch.save+fsync | signal -> written | signal -> exited "
           "| load | torch.load | relaunch -> first step | torch import | DDP wrap |",
           "|---" * 11 + "|"]  # fmt: skip
    for i, (s, r) in enumerate(zip(ck["stops"], ck["relaunches"], strict=True)):
        out.append(f"| stop {i + 1} (step {s['step']}) | {s['bytes'] / 1e9:.2f} GB | "
                   f"{s['write_seconds']:.2f} s | {ck['baseline_save_fsync_seconds']:.2f} s | "
                   f"{s['signal_to_written']:.2f} s | {s['signal_to_exited']:.2f} s | "
                   f"{r['checkpoint_load_seconds']:.2f} s | {ck['baseline_load_seconds']:.2f} s | "
                   f"{r['start_to_first_step']:.1f} s | {r['torch_import_seconds']:.1f} s | "
                   f"{r['ddp_wrap_seconds']:.1f} s |")  # fmt: skip
    return out


def report(res: dict[str, Any]) -> str:
    lines: list[str] = []
    if res.get("sweep", {}).get("points"):
        lines += ["Step time (median after warm-up) and memory per per-GPU batch:", ""]
        lines += step_table(res)
        for key in ("sweep", "sweep_repeat", "sweep_final"):
            if res.get(key, {}).get("model_fit"):
                lines += ["", f"hpcorch/model/throughput.py against {key} (predicted, error):", ""]
                lines += fit_table(res[key])
    if res.get("old_timing", {}).get("points"):
        lines += ["", "Step time the runtime reports, before and after the fix:", ""]
        lines += timing_table(res)
    if res.get("checkpoint", {}).get("stops"):
        lines += ["", "Checkpoints of the gpt2 preset:", "", *checkpoint_table(res["checkpoint"])]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(json.loads(Path(sys.argv[1]).read_text())))
