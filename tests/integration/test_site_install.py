"""slurm/install-site (issue 33, item 6): hpcorch installed once for every user of a machine,
as the integration tests' second users run it. The installation is root's, everyone reads
it and nobody else writes it; it is this checkout, built as a wheel (not an editable
install); every user runs `hpcorch` with what the module file sets, the job wrapper found
without it; the systemd unit starts the installed command; re-run, it is up to date at once,
and a changed tree is rebuilt."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.users import (
    ALICE,
    BOB,
    INSTALL,
    SITE_OPTIONS,
    can_run,
    ensure_user,
    install_site,
    module_env,
    world_dir,
)

pytestmark = pytest.mark.slurm

WRAPPER = "share/hpcorch/jobscripts/hpcorch-run.sbatch"


@pytest.fixture(scope="module", autouse=True)
def users() -> None:
    why = can_run()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    for user in (ALICE, BOB):
        ensure_user(user)


def as_user(user: str, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = ["setpriv", "--reuid", user, "--regid", user, "--init-groups", *argv]
    return subprocess.run(cmd, env=env, text=True, capture_output=True, cwd="/", check=False)


def user_env(prefix: Path) -> dict[str, str]:
    """A login shell's environment after `module load hpcorch`, and nothing else."""
    module = module_env(prefix)
    return {**module, "PATH": f"{module['PATH']}:/usr/bin:/bin", "LANG": "C.UTF-8"}


def site_packages(prefix: Path) -> Path:
    (found,) = (prefix / "lib").glob("python3.*/site-packages")
    return found


def test_the_installation_is_roots_read_by_everyone_and_this_checkout() -> None:
    prefix = install_site()
    for top, dirs, files in os.walk(prefix):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            where = os.path.join(top, name)
            assert st.st_uid == 0 and st.st_gid == 0, f"{where} is not root's"
            if stat.S_ISLNK(st.st_mode):
                continue
            assert not st.st_mode & 0o022, f"{where} is writable by others ({st.st_mode:o})"
            want = 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
            assert st.st_mode & want == want, f"{where} is not readable by all ({st.st_mode:o})"
    # Debian's interpreter, which every user may run
    assert os.path.realpath(prefix / "bin" / "python") == os.path.realpath("/usr/bin/python3")
    # a wheel of this checkout: every file of the package as it is in the tree
    installed = site_packages(prefix) / "hpcorch"
    for src in (REPO / "hpcorch").rglob("*"):
        if src.is_file() and "__pycache__" not in src.parts and src.suffix != ".pyc":
            dst = installed / src.relative_to(REPO / "hpcorch")
            assert dst.read_bytes() == src.read_bytes(), f"{dst} differs from the checkout"
    (dist,) = site_packages(prefix).glob("hpcorch-*.dist-info")
    assert (
        not (dist / "direct_url.json").exists()
        or "editable" not in (dist / "direct_url.json").read_text()
    )
    assert (prefix / WRAPPER).read_bytes() == (REPO / "jobscripts/hpcorch-run.sbatch").read_bytes()
    # the unit starts the installed command
    unit = (prefix / "share/hpcorch/systemd/hpcorch-controller.service").read_text()
    (start,) = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    assert shlex.split(start)[:2] == [str(prefix / "bin" / "hpcorch"), "controller"]
    # the Tcl module sets what the Lua one does
    tcl = (prefix / "share/modulefiles/hpcorch").glob("*")
    tcl_env = dict(re.findall(r"^setenv (\S+) (\S+)$", next(tcl).read_text(), re.M))
    lua_env = module_env(prefix)
    assert tcl_env == {k: v for k, v in lua_env.items() if k != "PATH"}
    assert lua_env["HPCORCH_WRAPPER"] == str(prefix / WRAPPER)
    # run again: nothing to do
    again = subprocess.run(
        [str(INSTALL), str(prefix), *SITE_OPTIONS], capture_output=True, text=True, check=True
    )
    assert "is up to date" in again.stderr, again.stderr


def test_every_user_runs_the_installed_hpcorch() -> None:
    prefix = install_site()
    env = user_env(prefix)
    out = as_user(ALICE, "hpcorch", "submit", "--help", env=env)
    assert out.returncode == 0 and "--min-gpus" in out.stdout, out.stderr
    probe = (
        "import hpcorch, hpcorch.paths as p; from importlib import metadata as m; "
        "print(hpcorch.__file__); print(p.wrapper_path()); print(m.version('torch'))"
    )
    env.pop("HPCORCH_WRAPPER")  # the installed hpcorch finds its wrapper without it
    out = as_user(BOB, str(prefix / "bin" / "python"), "-c", probe, env=env)
    assert out.returncode == 0, out.stderr
    where, wrapper, torch = out.stdout.split()
    assert where == str(site_packages(prefix) / "hpcorch" / "__init__.py")
    assert wrapper == str(prefix / WRAPPER)
    assert torch == "2.13.0+cpu"  # --with-torch: the CPU build


def copy_tree(dst: Path) -> Path:
    """What slurm/install-site builds from, copied: a checkout the test may change."""
    for part in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / part, dst / part)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("hpcorch", "jobscripts", "slurm/site"):
        shutil.copytree(REPO / part, dst / part, ignore=ignore)
    for part in ("install-site", "hpcorch-controller.service", "hpcorch-controller.toml",
                 "job_submit.lua"):  # fmt: skip
        shutil.copy2(REPO / "slurm" / part, dst / "slurm" / part)
    return dst / "slurm" / "install-site"


@pytest.mark.slow
def test_a_changed_tree_is_rebuilt_and_bad_requests_are_refused() -> None:
    """A site without torch (numpy, click only): installed, changed, installed again; and
    what it refuses, with one line each."""
    root = world_dir("hpcorch-install-")
    try:
        install = copy_tree(root)
        prefix = root / "prefix"
        run = [str(install), str(prefix), "--extras", "", "--quiet"]
        subprocess.run(run, check=True, capture_output=True, text=True)
        probe = "import hpcorch.errors as e; print(getattr(e, 'CHANGED', 0))"
        py = str(prefix / "bin" / "python")
        out = as_user(ALICE, py, "-c", probe, env=user_env(prefix))
        assert out.stdout.strip() == "0", out.stderr
        with (root / "hpcorch" / "errors.py").open("a") as f:
            f.write("\nCHANGED = 1\n")
        subprocess.run(run, check=True, capture_output=True, text=True)
        out = as_user(ALICE, py, "-c", probe, env=user_env(prefix))
        assert out.stdout.strip() == "1", out.stderr
        again = subprocess.run(run[:-1], check=True, capture_output=True, text=True)
        assert "is up to date" in again.stderr
        names = [n.lower() for n in os.listdir(site_packages(prefix))]
        assert not any(n.startswith(("torch", "nvidia")) for n in names)
        private = root / "private"
        private.mkdir(mode=0o700)
        for argv, said in (
            ([str(install), "relative/prefix"], "PREFIX must be an absolute path"),
            ([str(install), str(private / "x")], "not searchable by other users"),
            ([str(install), str(prefix), "--bogus"], "unknown option '--bogus'"),
        ):
            res = subprocess.run(argv, capture_output=True, text=True, check=False)
            assert res.returncode != 0 and said in res.stderr, res.stderr
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        res = as_user(ALICE, str(install), str(root / "mine"), env={"PATH": "/usr/bin:/bin"})
        assert res.returncode != 0 and "needs root" in res.stderr, res.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
