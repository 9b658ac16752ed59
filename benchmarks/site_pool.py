"""A site on the local machine for benchmarks/site_scale.py: a pool of many virtual nodes
whose SlurmUser is the controller's own Unix user (``hpcorch``, a Slurm operator without
slurmdbd), jobs of many real second users, the controller as its own user, and the
incidents an overloaded slurmctld makes (stopped, or slow to answer).

Needs root: it creates the users, runs the controller and the submissions as them
(setpriv) and stops slurmctld. The users run Debian's /usr/bin/python3 with a
world-readable copy of hpcorch and the few packages it needs (no torch: the jobs are
benchmarks/light_job.py), as tests/integration/users.py sets a site up.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
POOL = REPO / "slurm" / "pool"
PYTHON = "/usr/bin/python3"
CONTROLLER = "hpcorch"
SHIPPED = ("light_job.py", "light_profile.py", "site_submitter.py")
"""What the users run from the site, besides hpcorch and its job wrapper."""


def ensure_user(name: str, system: bool = False) -> int:
    """The uid of ``name``, created (no home, no login shell) if missing: under a lock,
    since test sessions and runs side by side (.ci/run's lanes) may make the same user at
    the same moment, and useradd refuses while another holds /etc/passwd."""
    with open("/tmp/hpcorch-test-users.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            argv = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin"]
            subprocess.run([*argv, *(["--system"] if system else []), name], check=True)
    return int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout)


def user_names(n: int) -> list[str]:
    return [f"hpcorch-u{i:02d}" for i in range(1, n + 1)]


def make_site(root: Path, pyslurm_wheel: str = "") -> Path:
    """A world-readable copy of what the users (and the controller) run: hpcorch, the job
    wrapper, click and numpy, the emulated job; pyslurm when given its wheel."""
    import click
    import numpy

    site = root / "site"
    shutil.rmtree(site, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "hpcorch", site / "hpcorch", ignore=ignore)
    shutil.copytree(REPO / "jobscripts", site / "jobscripts", ignore=ignore)
    for mod in (click, numpy):
        src = Path(str(mod.__file__)).parent
        shutil.copytree(src, site / src.name, ignore=ignore)
    libs = Path(str(numpy.__file__)).parent.parent / "numpy.libs"
    if libs.exists():
        shutil.copytree(libs, site / "numpy.libs")
    for name in SHIPPED:
        shutil.copy2(REPO / "benchmarks" / name, site / name)
    if pyslurm_wheel:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
             "--disable-pip-version-check", "--target", str(site), pyslurm_wheel],
            check=True,
        )  # fmt: skip
    subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)
    return site


def user_home(root: Path, user: str) -> Path:
    """The user's $HPCORCH_HOME as a site sets it up: the user's, group hpcorch (setgid),
    so that the controller reads the jobs' metrics and no one else can."""
    home = root / "home" / user
    if not home.exists():
        home.parent.mkdir(mode=0o711, exist_ok=True)
        home.parent.chmod(0o711)
        subprocess.run(
            ["install", "-d", "-o", user, "-g", CONTROLLER, "-m", "2750", str(home)], check=True
        )
    return home


def pool_env(pool_dir: Path) -> dict[str, str]:
    """The environment that reaches the pool (what ``slurm/pool env`` exports)."""
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    out = subprocess.run(
        ["bash", "-c", f'eval "$({POOL} env)" && env -0'],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    keys = ("SLURM_CONF", "HPCORCH_POOL_DIR", "PATH", "LD_LIBRARY_PATH")
    return {**env, **{k: found[k] for k in keys if k in found}}


def pool_up(
    pool_dir: Path, nodes: int, gpus: int, cpus: int, port: int, slurm: str
) -> dict[str, str]:
    """The pool (slurm/pool up), slurmctld running as the controller's user, with empty
    state: a run interrupted before it brought its pool down left its reservation and its
    controller's lease in slurmctld's state, which the next run's controller would find
    held (and stand by)."""
    pool_down(pool_dir)
    shutil.rmtree(pool_dir / "state", ignore_errors=True)
    ensure_user(CONTROLLER, system=True)  # (slurmctld runs as it: made before, on a new machine)
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    argv = [str(POOL), "up", "--nodes", str(nodes), "--gpus-per-node", str(gpus)]
    argv += ["--cpus-per-node", str(cpus), "--port-base", str(port), "--slurm", slurm]
    argv += ["--slurm-user", CONTROLLER, "--open"]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"site_scale: slurm/pool up failed: {res.stderr.strip()[-2000:]}")
    return pool_env(pool_dir)


def resume_unkillable(env: dict[str, str]) -> list[str]:
    """Nodes Slurm drained with ``Reason=Kill task failed``, resumed as an admin would
    after an incident: a step that ended while slurmctld was stopped could not report its
    end, and slurmstepd gave up on it after ``UnkillableStepTimeout`` (seen on 22.05 after
    a 120 s SIGSTOP). Their names ([] if none, or if Slurm did not answer)."""
    try:
        res = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N|%E"],
            env=env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return []
    rows = [ln.split("|", 1) for ln in res.stdout.splitlines() if "|" in ln]
    names = sorted({n for n, why in rows if why.startswith("Kill task failed")})
    if names and res.returncode == 0:
        argv = ["scontrol", "update", f"NodeName={','.join(names)}", "State=RESUME"]
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
    return names if res.returncode == 0 else []


def pool_down(pool_dir: Path) -> None:
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    subprocess.run([str(POOL), "down"], env=env, capture_output=True, check=False)


def as_user(user: str, env: dict[str, str], *argv: str) -> list[str]:
    """``argv`` as ``user`` (its uid, gid and groups) with exactly ``env``."""
    inner = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
    return ["setpriv", "--reuid", user, "--regid", user, "--init-groups", *inner, *argv]


@dataclass
class Site:
    """Where everything lives, and the environments of its users and its controller."""

    root: Path
    site: Path
    pool_dir: Path
    env: dict[str, str]
    """Root's, reaching the pool."""
    users: list[str]
    backend: str
    spool: Path = field(init=False)
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.root / "controller"
        self.spool = self.state / "jobs"

    def base_env(self) -> dict[str, str]:
        env = {
            "PATH": self.env["PATH"],
            "SLURM_CONF": self.env["SLURM_CONF"],
            "PYTHONPATH": str(self.site),
            "PYTHONDONTWRITEBYTECODE": "1",
            "LANG": "C.UTF-8",
        }
        if self.env.get("LD_LIBRARY_PATH"):
            env["LD_LIBRARY_PATH"] = self.env["LD_LIBRARY_PATH"]
        return env

    def user_env(self, user: str) -> dict[str, str]:
        home = user_home(self.root, user)
        return {
            **self.base_env(),
            "HOME": str(home),
            "HPCORCH_HOME": str(home),
            "HPCORCH_SPOOL": str(self.spool),
            "HPCORCH_PYTHON": PYTHON,
            "HPCORCH_WRAPPER": str(self.site / "jobscripts" / "hpcorch-run.sbatch"),
            "HPCORCH_SLURM_BACKEND": "cli",
            "PYTHONUNBUFFERED": "1",
        }

    def controller_env(self) -> dict[str, str]:
        backend = "cli" if self.backend == "commands" else self.backend
        return {
            **self.base_env(),
            "HOME": "/nonexistent",
            "HPCORCH_SLURM_BACKEND": backend,
        }


def prepare(root: Path, pool_dir: Path, env: dict[str, str], n_users: int, backend: str,
            pyslurm_wheel: str = "") -> Site:  # fmt: skip
    """Users, their homes, the site copy and the controller's state directory."""
    ensure_user(CONTROLLER, system=True)
    users = user_names(n_users)
    for u in users:
        ensure_user(u)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)
    site = make_site(root, pyslurm_wheel if backend == "pyslurm" else "")
    s = Site(root=root, site=site, pool_dir=pool_dir, env=env, users=users, backend=backend)
    shutil.rmtree(s.state, ignore_errors=True)
    shutil.rmtree(root / "home", ignore_errors=True)
    s.state.mkdir(mode=0o711)
    shutil.chown(s.state, CONTROLLER, CONTROLLER)
    for u in users:
        user_home(root, u)
    return s


def start_controller(s: Site, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``hpcorch controller`` as its own user (the systemd unit's user), on the site."""
    argv = [PYTHON, "-m", "hpcorch", "controller", "--state-dir", str(s.state), *args]
    out = log.open("w")
    return subprocess.Popen(
        as_user(CONTROLLER, s.controller_env(), *argv), stdout=subprocess.DEVNULL, stderr=out,
        cwd="/",
    )  # fmt: skip


class Submitters:
    """One benchmarks/site_submitter.py per user, each running as its user."""

    def __init__(self, s: Site) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.answers: dict[str, str] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        for user in s.users:
            argv = as_user(user, s.user_env(user), PYTHON, str(s.site / "site_submitter.py"))
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                cwd=str(user_home(s.root, user)),
            )  # fmt: skip
            self.procs[user] = proc
            t = threading.Thread(target=self._read, args=(proc,), daemon=True)
            t.start()
            self.threads.append(t)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            name, _, rest = line.strip().partition(" ")
            with self.lock:
                self.answers[name] = rest

    def submit(self, user: str, job: dict[str, Any]) -> None:
        proc = self.procs[user]
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()

    def taken(self) -> dict[str, str]:
        with self.lock:
            return dict(self.answers)

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


class _StepTimeHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server: StepTimeServer = self.server  # type: ignore[assignment]
        try:
            ask = json.loads(self.rfile.readline(4096))
            seconds = server.seconds(ask)
            self.wfile.write(json.dumps({"seconds": seconds}).encode() + b"\n")
        except (ValueError, KeyError, TypeError, OSError) as exc:
            with contextlib.suppress(OSError):
                self.wfile.write(json.dumps({"error": str(exc)[:200]}).encode() + b"\n")


class StepTimeServer(socketserver.ThreadingUnixStreamServer):
    """The step times of the emulated jobs (benchmarks/light_job.py ``--step-times``),
    from the simulator's own model (``AppTrace.iteration_time``), over a Unix socket every
    user may connect to: a job asks once per launch and per batch change."""

    daemon_threads = True

    def __init__(self, path: Path) -> None:
        from hpcorch.sim.traces import load_apps

        path.unlink(missing_ok=True)
        super().__init__(str(path), _StepTimeHandler)
        path.chmod(0o666)
        self.apps = load_apps()
        self._scaled: dict[tuple[str, float], Any] = {}
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def seconds(self, ask: dict[str, Any]) -> float:
        name, scale = str(ask["app"]), float(ask["scale"])
        counts = tuple(int(c) for c in ask["counts"])
        micro, accum = int(ask["micro"]), int(ask["accum"])
        if name not in self.apps or not 0 < scale <= 1 or not 0 < len(counts) <= 4096:
            raise ValueError("bad question")
        if not all(0 < c <= 64 for c in counts) or not 0 < micro < 10**7 or not 0 < accum < 10**6:
            raise ValueError("bad question")
        with self._lock:
            app = self._scaled.get((name, scale))
            if app is None:
                app = self._scaled[(name, scale)] = self.apps[name].scaled(scale)
            return float(app.iteration_time(counts, micro, accum))

    def close(self) -> None:
        self.shutdown()
        self.server_close()


# --- an overloaded slurmctld ---------------------------------------------------------------


def nice_compute_side(pool_dir: Path, nice: int) -> int:
    """Run the pool's slurmd daemons, and so every job step they start (slurmstepd, the
    job scripts, the tasks inherit it), at ``nice``: at a site they are other machines, and
    the login node's slurmctld, controller and users' commands do not wait behind them for
    a CPU. The number of daemons reniced."""
    done = 0
    for f in sorted((pool_dir / "run").glob("slurmd-*.pid")):
        try:
            os.setpriority(os.PRIO_PROCESS, int(f.read_text().split()[0]), nice)
        except (OSError, ValueError, IndexError):
            continue
        done += 1
    return done


def slurmctld_pid(pool_dir: Path) -> int:
    return int((pool_dir / "run" / "slurmctld.pid").read_text().split()[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Incident:
    """What was done to slurmctld, and when (Unix time)."""

    kind: str
    """stop (SIGSTOP for ``seconds``) or slow (stopped ``off_s`` of every ``on_s + off_s``)."""
    seconds: float
    start: float = 0.0
    end: float = 0.0
    on_s: float = 0.0
    off_s: float = 0.0

    def describe(self) -> str:
        if self.kind == "stop":
            return f"slurmctld stopped (SIGSTOP) for {self.seconds:.0f} s"
        share = self.on_s / (self.on_s + self.off_s)
        return (
            f"slurmctld slowed for {self.seconds:.0f} s (running {self.on_s:g} s of every "
            f"{self.on_s + self.off_s:g} s: {share:.0%} of the time)"
        )


@contextlib.contextmanager
def _always_continued(pid: int) -> Iterator[None]:
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def stop_slurmctld(pool_dir: Path, inc: Incident) -> None:
    """SIGSTOP slurmctld for ``inc.seconds`` (it is always continued)."""
    pid = slurmctld_pid(pool_dir)
    inc.start = time.time()
    with _always_continued(pid):
        os.kill(pid, signal.SIGSTOP)
        time.sleep(inc.seconds)
    inc.end = time.time()


def slow_slurmctld(pool_dir: Path, inc: Incident, stop: threading.Event | None = None) -> None:
    """slurmctld runs ``inc.on_s`` of every ``on_s + off_s`` seconds for ``inc.seconds``:
    every RPC (everyone's) waits, as when slurmctld is starved."""
    pid = slurmctld_pid(pool_dir)
    inc.start = time.time()
    deadline = time.monotonic() + inc.seconds
    with _always_continued(pid):
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            os.kill(pid, signal.SIGCONT)
            time.sleep(inc.on_s)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(inc.off_s)
    inc.end = time.time()


def parse_incidents(stops: Sequence[float], slow: Sequence[float]) -> list[Incident]:
    """``--stall 30,120`` and ``--slow SECONDS,ON,OFF`` as incidents, in that order."""
    out = [Incident("stop", s) for s in stops]
    if slow:
        seconds, on_s, off_s = [*slow, 0.1, 4.9][:3]
        out.append(Incident("slow", seconds, on_s=on_s, off_s=off_s))
    return out
