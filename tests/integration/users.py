"""Real Unix users on the local pool: the controller as its own unprivileged user
(``hpcorch``), jobs as two others, as at a site.

Needs root (to create the users, and for ``slurm/pool up --slurm-user``). The users run
Debian's /usr/bin/python3 with a copy of hpcorch, click and numpy in a world-readable
directory, so nothing depends on the checkout's or the virtual environment's permissions.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy
import prometheus_client
import pytest

from tests.conftest import POOL_SCRIPT, REPO, Pool, pool_env, slurm_release

CONTROLLER = "hpcorch"
ALICE = "hpcorch-alice"
BOB = "hpcorch-bob"
PYTHON = "/usr/bin/python3"


def can_run() -> str | None:
    """Why the multi-user tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create users and run jobs as them"
    for tool in ("useradd", "setpriv", PYTHON):
        if not shutil.which(tool):
            return f"needs {tool}"
    return None


def ensure_user(name: str, system: bool = False) -> int:
    """The uid of ``name``, created (without a home) if missing."""
    if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
        argv = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        subprocess.run([*argv, *(["--system"] if system else []), name], check=True)
    return int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout)


def make_site(root: Path) -> Path:
    """A world-readable copy of what the users run: hpcorch, the job wrapper, click, numpy,
    prometheus-client."""
    site = root / "site"
    ignore = shutil.ignore_patterns("__pycache__", "data")
    shutil.copytree(REPO / "hpcorch", site / "hpcorch", ignore=ignore)
    shutil.copytree(REPO / "jobscripts", site / "jobscripts")
    for mod in (click, numpy, prometheus_client):  # hpcorch metrics, through the controller
        src = Path(str(mod.__file__)).parent
        shutil.copytree(src, site / src.name, ignore=shutil.ignore_patterns("__pycache__"))
    libs = Path(str(numpy.__file__)).parent.parent / "numpy.libs"
    if libs.exists():
        shutil.copytree(libs, site / "numpy.libs")
    subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)
    return site


def world_dir(prefix: str) -> Path:
    """A new directory that every user can pass through (not list)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o711)
    return d


@dataclass
class Site:
    """A second local pool whose slurmctld runs as the controller's user (the one way to
    make a user a Slurm operator without slurmdbd), and the users' environment."""

    root: Path
    site: Path
    pool_dir: Path
    env: dict[str, str]
    uids: dict[str, int]

    def as_user(
        self,
        user: str,
        *argv: str,
        check: bool = True,
        env: dict[str, str] | None = None,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` as ``user`` (its own uid, gid and groups), in the root directory."""
        cmd = ["setpriv", "--reuid", user, "--regid", user, "--init-groups", *argv]
        res = subprocess.run(
            cmd, env=env or self.env, text=True, capture_output=True, cwd=self.root, **kw
        )
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv[:4])} as {user}: {res.stderr.strip()[-2000:]}")
        return res

    def hpcorch(
        self, user: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.as_user(user, PYTHON, "-m", "hpcorch", *args, check=check)

    def slurm(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, text=True, capture_output=True)

    def user_home(self, user: str) -> Path:
        """The user's $HPCORCH_HOME as a site sets it up: one directory per user on the
        shared file system, the user's, group hpcorch (setgid), so that the controller
        can read the job's metrics and nobody else can."""
        home = self.root / "home" / user
        if not home.exists():
            home.parent.mkdir(mode=0o711, exist_ok=True)
            subprocess.run(
                ["install", "-d", "-o", user, "-g", CONTROLLER, "-m", "2750", str(home)],
                check=True,
            )
        return home

    def user_env(self, user: str, **extra: str) -> dict[str, str]:
        return {**self.env, "HPCORCH_HOME": str(self.user_home(user)), **extra}


def start_site(port: int, closed: str = "") -> Site:
    """Users, a world-readable copy of hpcorch, and a 2-node pool whose SlurmUser is the
    controller's user, on port base ``port``; ``closed``: the Lua pattern of reservation
    names Slurm keeps closed (slurm/job_submit.lua; '' for none)."""
    uids = {CONTROLLER: ensure_user(CONTROLLER, system=True)}
    for user in (ALICE, BOB):
        uids[user] = ensure_user(user)
    root = world_dir("hpcorch-site-")
    site = make_site(root)
    pool_dir = root / "pool"
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HPCORCH_POOL_DIR": str(pool_dir),
        "PYTHONPATH": str(site),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HPCORCH_WRAPPER": str(site / "jobscripts" / "hpcorch-run.sbatch"),
        "HPCORCH_SLURM_BACKEND": "cli",
    }
    up = [str(POOL_SCRIPT), "up", "--nodes", "2", "--port-base", str(port)]
    up += ["--slurm", slurm_release(), "--slurm-user", CONTROLLER]
    up += ["--closed", closed] if closed else ["--open"]
    subprocess.run(up, env=env, check=True, capture_output=True, text=True)
    env = pool_env(env)
    return Site(root=root, site=site, pool_dir=pool_dir, env=env, uids=uids)


def stop_site(s: Site) -> None:
    subprocess.run([str(POOL_SCRIPT), "down"], env=s.env, capture_output=True)
    shutil.rmtree(s.root, ignore_errors=True)


def sbatch_as(s: Site, user: str, comment: str, reservation: str, extra: Sequence[str] = ()) -> int:
    """A held job of ``user`` in ``reservation`` with a comment the user wrote by hand."""
    res = s.as_user(
        user,
        "sbatch",
        "--parsable",
        "--hold",
        f"--reservation={reservation}",
        "--gres=gpu:1",
        "--output=/dev/null",
        f"--comment={comment}",
        *extra,
        "--wrap",
        "sleep 600",
    )
    return int(res.stdout.strip().split(";")[0])


@contextmanager
def site_beside(pool: Pool, offset: int = 50, closed: str = "") -> Iterator[Site]:
    """A site pool (start_site) on the test pool's port base + ``offset`` (+17 and +101..
    of the test pool never meet +67, +151..), stopped after; skipped (failed in CI) where
    users cannot be made. One module at a time uses a given offset."""
    why = can_run()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    settings = (pool.dir / "pool.env").read_text()
    port = int(re.search(r"^port_base=(\d+)", settings, re.M).group(1))  # type: ignore[union-attr]
    s = start_site(port + offset, closed)
    try:
        yield s
    finally:
        stop_site(s)
