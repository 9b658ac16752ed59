from __future__ import annotations

from pathlib import Path

import pytest

from hpcorch.sim.traces import AppTrace, default_data_dir, load_apps


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = default_data_dir()
    if not (d / "traces").is_dir():
        pytest.fail(f"trace data not found at {d}: it ships in hpcorch/sim/data/pollux")
    return d


@pytest.fixture(scope="session")
def apps(data_dir: Path) -> dict[str, AppTrace]:
    return load_apps(data_dir)


@pytest.fixture()
def small_workload(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text(
        "name,time,application,num_replicas,batch_size\n"
        "ncf-0,0,ncf,1,256\n"
        "cifar10-1,30,cifar10,2,256\n"
        "ncf-2,100,ncf,2,512\n"
        "bert-3,200,bert,4,12\n"
        "ncf-4,250,ncf,1,1024\n"
    )
    return path
