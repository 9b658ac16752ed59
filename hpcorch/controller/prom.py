"""Prometheus text exposition of the controller's state, rendered from the store."""

from __future__ import annotations

import json

from hpcorch.controller.store import Store


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(store: Store) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value:g}")

    pool = json.loads(store.get_meta("pool") or "[]")
    busy = sum(n["gpus_used"] for n in pool if n["usable"])
    total = sum(n["gpus"] for n in pool if n["usable"])
    down = sum(n["gpus"] for n in pool if not n["usable"])
    metric(
        "hpcorch_pool_gpus",
        "gauge",
        "GPUs of the pool by state.",
        [('{state="busy"}', busy), ('{state="free"}', total - busy), ('{state="down"}', down)],
    )
    jobs = store.jobs(active_only=True)
    phases: dict[str, int] = {}
    for j in jobs:
        phases[j.phase] = phases.get(j.phase, 0) + 1
    metric(
        "hpcorch_jobs",
        "gauge",
        "Active jobs by phase.",
        [(f'{{phase="{p}"}}', float(n)) for p, n in sorted(phases.items())],
    )

    def job_labels(j: object) -> str:
        sid, name, user = (getattr(j, k) for k in ("slurm_id", "name", "user"))
        return f'{{job="{sid}",name="{_esc(name)}",user="{_esc(user)}"}}'

    metric(
        "hpcorch_job_gpus",
        "gauge",
        "GPUs each job holds.",
        [(job_labels(j), float(j.gpus if j.phase in ("running", "stopping") else 0)) for j in jobs],
    )
    metric(
        "hpcorch_job_global_batch",
        "gauge",
        "Global batch size of each job.",
        [(job_labels(j), float(j.global_batch or j.target_batch or j.batch)) for j in jobs],
    )
    metric(
        "hpcorch_job_samples_per_second",
        "gauge",
        "Training throughput each job reports.",
        [(job_labels(j), j.samples_per_s) for j in jobs],
    )
    metric(
        "hpcorch_resizes_total",
        "counter",
        "Resizes decided since the state was created.",
        [("", float(store.count_decisions("signal", "resize")))],
    )
    metric(
        "hpcorch_preemptions_total",
        "counter",
        "Preemptions decided since the state was created.",
        [("", float(store.count_decisions("signal", "preempt")))],
    )
    cycles = store.recent_cycles(50)
    if cycles:
        last = cycles[0]
        metric(
            "hpcorch_decision_seconds",
            "gauge",
            "Policy decision time of the last round.",
            [("", last["decision_s"])],
        )
        metric(
            "hpcorch_cycle_seconds",
            "gauge",
            "Duration of the last controller cycle.",
            [("", last["seconds"])],
        )
        metric(
            "hpcorch_slurm_calls_per_cycle",
            "gauge",
            "Slurm commands run by the last cycle.",
            [("", float(last["slurm_calls"]))],
        )
        metric(
            "hpcorch_last_cycle_timestamp_seconds",
            "gauge",
            "When the last cycle ran.",
            [("", last["time"])],
        )
    return "\n".join(lines) + "\n"
