"""Average JCT and wall time of the direct loop and the controller engine, per workload.

Usage: python benchmarks/simulate_engines.py POLICIES WORKLOAD.csv[,...] ENGINES
e.g.   python benchmarks/simulate_engines.py tiresias,ones \\
           load-1.0/workload-6 direct,controller
"""

import sys
import time
from pathlib import Path

from hpcorch.policy import make_policy
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.loop import SimConfig, simulate
from hpcorch.sim.traces import load_apps
from hpcorch.sim.workload import load_workload

apps = load_apps()
for wpath in sys.argv[2].split(","):
    wl = load_workload(Path(wpath), apps)
    for pol in sys.argv[1].split(","):
        for eng in sys.argv[3].split(","):
            t0 = time.time()
            fn = simulate if eng == "direct" else simulate_controlled
            r = fn(wl, make_policy(pol, 0), apps, SimConfig())
            s = r.summary()
            name = f"{Path(wpath).parent.name}/{Path(wpath).stem}"
            print(
                f"{name} {pol:9s} {eng:10s} avg_jct {s['avg_jct']:9.0f} p50 {s['p50_jct']:8.0f}"
                f" makespan {s['makespan']:8.0f} restarts/job {s['restarts_per_job']:.2f}"
                f" wall {time.time() - t0:6.1f}s",
                flush=True,
            )
