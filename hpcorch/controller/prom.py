"""The controller's Prometheus metrics, rendered from its store by ``prometheus-client``
(the optional extra ``hpcorch[prometheus]``).

Every scrape reads the store afresh (``StoreCollector``), so ``hpcorch metrics`` runs as
its own process beside the controller. Counters and histograms are totals since the
state was created (``Store.cycle_totals``); per-job series are labelled
``slurm_job_id``, never ``job`` (Prometheus' own target label).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from hpcorch.controller.store import Store
from hpcorch.controller.usage import HOLDING, user_usage
from hpcorch.errors import HpcorchError

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

INSTALL_HINT = "pip install 'hpcorch[prometheus]'"


def client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise HpcorchError(
            f"metrics need the prometheus-client package ({exc}): {INSTALL_HINT}"
        ) from None
    return prometheus_client


def _histogram(core: Any, name: str, help_: str, hist: dict[str, Any]) -> Metric:
    buckets = [(str(b), float(c)) for b, c in zip(hist["bounds"], hist["counts"], strict=True)]
    buckets.append(("+Inf", float(hist["count"])))
    fam = core.HistogramMetricFamily(name, help_, unit="seconds")
    fam.add_metric([], buckets, float(hist["sum"]))
    return fam  # type: ignore[no-any-return]


def collect(store: Store) -> Iterator[Metric]:
    """Every metric family, read from ``store`` now."""
    client()
    core = importlib.import_module("prometheus_client.core")
    gauge, counter = core.GaugeMetricFamily, core.CounterMetricFamily

    pool = json.loads(store.get_meta("pool") or "[]")
    busy = sum(n["gpus_used"] for n in pool if n["usable"])
    total = sum(n["gpus"] for n in pool if n["usable"])
    down = sum(n["gpus"] for n in pool if not n["usable"])
    g = gauge("hpcorch_pool_gpus", "GPUs of the pool by state.", labels=["state"])
    for state, value in (("busy", busy), ("free", total - busy), ("down", down)):
        g.add_metric([state], value)
    yield g

    every = store.jobs()
    jobs = [j for j in every if j.active]
    phases: dict[str, int] = {}
    for j in jobs:
        phases[j.phase] = phases.get(j.phase, 0) + 1
    g = gauge("hpcorch_jobs", "Active jobs by phase.", labels=["phase"])
    for phase, n in sorted(phases.items()):
        g.add_metric([phase], n)
    yield g

    labels = ["slurm_job_id", "name", "user"]
    per_job: list[tuple[str, str, Callable[[Any], float]]] = [
        ("hpcorch_job_gpus", "GPUs each job holds.", lambda j: j.gpus if j.phase in HOLDING else 0),
        (
            "hpcorch_job_global_batch",
            "Global batch size of each job.",
            lambda j: j.global_batch or j.target_batch or j.batch,
        ),
        (
            "hpcorch_job_samples_per_second",
            "Training throughput each job reports.",
            lambda j: j.samples_per_s,
        ),
    ]
    for name, help_, value in per_job:
        g = gauge(name, help_, labels=labels)
        for j in jobs:
            g.add_metric([str(j.slurm_id), j.name, j.user], float(value(j)))
        yield g

    usage = user_usage(every)
    c = counter(
        "hpcorch_user_gpu_seconds",
        "GPU time of each user's jobs in the pool (GPU-seconds).",
        labels=["user"],
    )
    for u in usage:
        c.add_metric([u.user], u.gpu_seconds)
    yield c
    g = gauge("hpcorch_user_gpus", "GPUs each user's jobs hold now.", labels=["user"])
    for u in usage:
        g.add_metric([u.user], u.gpus)
    yield g

    yield counter(
        "hpcorch_resizes",
        "Resizes decided since the state was created.",
        value=store.count_decisions("signal", "resize"),
    )
    yield counter(
        "hpcorch_preemptions",
        "Preemptions decided since the state was created.",
        value=store.count_decisions("signal", "preempt"),
    )
    totals = store.cycle_totals()
    yield counter("hpcorch_cycles", "Controller cycles run.", value=totals["cycles"])
    yield counter(
        "hpcorch_slurm_calls", "Slurm commands (or RPCs) made.", value=totals["slurm_calls"]
    )
    yield _histogram(
        core, "hpcorch_cycle_duration", "Controller cycle time.", totals["cycle_seconds"]
    )
    yield _histogram(
        core,
        "hpcorch_decision_duration",
        "Policy decision time of each scheduling round.",
        totals["decision_seconds"],
    )
    cycles = store.recent_cycles(1)
    if cycles:
        yield gauge(
            "hpcorch_last_cycle_timestamp_seconds",
            "When the last cycle ran (Unix time).",
            value=cycles[0]["time"],
        )
    end = store.get_meta("reservation_end")
    if end:
        yield gauge(
            "hpcorch_reservation_end_timestamp_seconds",
            "When the pool's reservation ends (Unix time; absent when it never ends).",
            value=float(end),
        )


def registry(open_store: Callable[[], Store]) -> CollectorRegistry:
    """A registry whose every scrape opens the store with ``open_store`` and reads it."""
    pc = client()

    class StoreCollector:
        def collect(self) -> Iterator[Metric]:
            store = open_store()
            try:
                yield from list(collect(store))
            finally:
                store.close()

    reg = pc.CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector())
    return reg  # type: ignore[no-any-return]


def render_metrics(store: Store) -> str:
    """The exposition text of ``store``'s metrics (Prometheus' text format 0.0.4)."""
    pc = client()
    reg = pc.CollectorRegistry(auto_describe=False)

    class Once:
        def collect(self) -> Iterator[Metric]:
            yield from collect(store)

    reg.register(Once())
    return pc.generate_latest(reg).decode()  # type: ignore[no-any-return]
