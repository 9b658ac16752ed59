"""Plain-text tables and plots of simulation results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hpcorch.sim.loop import SimResult


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A right-aligned text table (first column left-aligned)."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            if v != v:
                return "-"
            return f"{v:.2f}" if abs(v) < 10 else f"{v:.0f}"
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i == 0 else v.rjust(w)
            for i, (v, w) in enumerate(zip(vals, widths, strict=True))
        )

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


RESULT_HEADERS = (
    "workload",
    "policy",
    "avg JCT s",
    "p50 s",
    "p99 s",
    "makespan s",
    "bound s",
    "avg/bound",
    "util",
    "restarts/job",
    "decide ms",
    "max ms",
)


def result_row(workload: str, r: SimResult) -> list[object]:
    s = r.summary()
    return [
        workload,
        r.policy,
        s["avg_jct"],
        s["p50_jct"],
        s["p99_jct"],
        s["makespan"],
        s["lower_bound"],
        s["avg_jct"] / s["lower_bound"] if s["lower_bound"] > 0 else float("nan"),
        s["utilization"],
        s["restarts_per_job"],
        s["decision_ms_mean"],
        s["decision_ms_max"],
    ]


def write_per_job(results: Sequence[tuple[str, SimResult]], path: Path) -> None:
    """One CSV row per job and run: JCT, queueing delay, restarts, GPU-seconds."""
    import csv

    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "workload",
                "policy",
                "job",
                "application",
                "submit_s",
                "jct_s",
                "queueing_s",
                "restarts",
                "gpu_seconds",
            ]
        )
        for workload, r in results:
            for j in r.jobs:
                w.writerow(
                    [
                        workload,
                        r.policy,
                        j.name,
                        j.application,
                        j.submit_time,
                        j.jct,
                        j.queueing_delay,
                        j.restarts,
                        round(j.gpu_seconds, 1),
                    ]
                )


def plot(results: Sequence[tuple[str, SimResult]], path: Path) -> None:
    """JCT CDF per run and GPUs in use over time, side by side, to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    multi = len({w for w, _ in results}) > 1
    for workload, r in results:
        label = f"{r.policy} ({workload})" if multi else r.policy
        jcts = np.sort(r.jcts)
        ax1.step(jcts, np.arange(1, len(jcts) + 1) / len(jcts), where="post", label=label)
        t = np.array([p[0] for p in r.timeline]) / 3600
        used = np.array([p[1] for p in r.timeline])
        ax2.step(t, used, where="post", label=label, linewidth=0.8)
    ax1.set_xscale("log")
    ax1.set_xlabel("JCT (s)")
    ax1.set_ylabel("fraction of jobs")
    ax1.set_title("JCT CDF")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("time (h)")
    ax2.set_ylabel("GPUs in use")
    ax2.set_title("GPUs in use over time")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
