"""Real Unix users on the local pool: the controller as its own unprivileged user
(``hpcorch``), jobs as two others, as at a site.

Needs root (to create the users, and for ``slurm/pool up --slurm-user``). The users run
hpcorch as a site installs it for everyone (slurm/install-site): a virtual environment on
Debian's /usr/bin/python3 with hpcorch installed from a wheel of this checkout, outside the
checkout (which may sit where other users cannot pass), and the environment its module
file sets. Nothing depends on the checkout's or the development environment's permissions.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.site_pool import ensure_user
from tests.conftest import POOL_SCRIPT, REPO, Pool, pool_env, slurm_release

CONTROLLER = "hpcorch"
ALICE = "hpcorch-alice"
BOB = "hpcorch-bob"
INSTALL = REPO / "slurm" / "install-site"
PREFIX = Path(
    os.environ.get("HPCORCH_TEST_SITE")
    or f"/var/cache/hpcorch/test-site-{zlib.crc32(str(REPO).encode()):08x}"
)
"""The installation the users run: one per checkout, kept between sessions (torch is
installed once; a changed tree is rebuilt in seconds), $HPCORCH_TEST_SITE to move it."""
SITE_OPTIONS = ("--with-torch", "--extras", "prometheus,sim", "--state-dir", "none")
"""What the tests install: torch and the simulator for the replay's jobs, prometheus-client
for `hpcorch metrics`; each test names its controller's state directory and spool."""
PYTHON = str(PREFIX / "bin" / "python")
"""The installation's interpreter (``PYTHON -m hpcorch`` is the installed hpcorch)."""


SLURM_BUILD_ENV = ("HPCORCH_SLURM_SOURCES", "HPCORCH_SLURM_CACHE")
"""Where slurm/build finds Slurm's sources and its builds: a site pool on a built release
needs them as the test pool does."""


def can_run() -> str | None:
    """Why the multi-user tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create users and run jobs as them"
    for tool in ("useradd", "setpriv", "python3"):  # PYTHON is made by install_site()
        if not shutil.which(tool):
            return f"needs {tool}"
    return None


@functools.cache
def install_site() -> Path:
    """slurm/install-site PREFIX (SITE_OPTIONS), once per session; the prefix. Quick when
    it is up to date; the first time on a machine (torch) takes minutes."""
    argv = [str(INSTALL), str(PREFIX), *SITE_OPTIONS, "--quiet"]
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise AssertionError(f"slurm/install-site failed: {res.stderr[-3000:]}")
    return PREFIX


def module_env(prefix: Path) -> dict[str, str]:
    """What `module load hpcorch` sets, read from the installation's Lmod file: the
    variables, and PATH with the installation's entry first."""
    (lua,) = (prefix / "share" / "lmod" / "hpcorch").glob("*.lua")
    env: dict[str, str] = {}
    for kind, key, value in re.findall(
        r'^(setenv|prepend_path)\("([A-Z_]+)", "([^"]*)"\)$', lua.read_text(), re.M
    ):
        env[key] = value if kind == "setenv" else f"{value}:{env.get(key, '')}".rstrip(":")
    return env


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
    prefix: Path
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
        """`hpcorch ARGS` as ``user``, the command the module put on PATH."""
        return self.as_user(user, "hpcorch", *args, check=check)

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


def start_site(port: int, closed: str = "", memory: bool = False) -> Site:
    """Users, the site installation of hpcorch, and a 2-node pool whose SlurmUser is the
    controller's user, on port base ``port``; ``closed``: the Lua pattern of reservation
    names Slurm keeps closed (slurm/job_submit.lua; '' for none); ``memory``: the pool
    schedules memory (slurm/pool up --memory)."""
    uids = {CONTROLLER: ensure_user(CONTROLLER, system=True)}
    for user in (ALICE, BOB):
        uids[user] = ensure_user(user)
    prefix = install_site()
    root = world_dir("hpcorch-site-")
    pool_dir = root / "pool"
    module = module_env(prefix)
    env = {
        "LANG": "C.UTF-8",
        "HPCORCH_POOL_DIR": str(pool_dir),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HPCORCH_SLURM_BACKEND": "cli",
        **{k: v for k, v in os.environ.items() if k in SLURM_BUILD_ENV},
        **module,  # `module load hpcorch`: PATH, HPCORCH_WRAPPER
        "PATH": f"{module['PATH']}:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    up = [str(POOL_SCRIPT), "up", "--nodes", "2", "--port-base", str(port)]
    up += ["--slurm", slurm_release(), "--slurm-user", CONTROLLER]
    up += ["--closed", closed] if closed else ["--open"]
    up += ["--memory"] if memory else []
    subprocess.run(up, env=env, check=True, capture_output=True, text=True)
    env = pool_env(env)
    return Site(root=root, prefix=prefix, pool_dir=pool_dir, env=env, uids=uids)


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
def site_beside(
    pool: Pool, offset: int = 50, closed: str = "", memory: bool = False
) -> Iterator[Site]:
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
    s = start_site(port + offset, closed, memory)
    try:
        yield s
    finally:
        stop_site(s)
