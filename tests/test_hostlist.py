"""Slurm hostlists and tasks-per-node lists (hpcorch/hostlist.py), on real clusters' names,
checked against ``scontrol show hostnames`` itself where Slurm is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hpcorch.hostlist import HostlistError, expand, first, tasks_per_node
from hpcorch.slurm.backend import expand_nodelist

CASES = [
    ("c196-011", ["c196-011"]),
    ("gpu-a[001-008]", [f"gpu-a{i:03d}" for i in range(1, 9)]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("n[1-10]", [f"n{i}" for i in range(1, 11)]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[01-3]", ["n01", "n02", "n03"]),
    ("n[1-002]", ["n1", "n2"]),
    ("n[1-3,5],m[7]", ["n1", "n2", "n3", "n5", "m7"]),
    ("gpu-[01-02],c196-011,login1", ["gpu-01", "gpu-02", "c196-011", "login1"]),
    ("c[1-2][3-4]", ["c13", "c14", "c23", "c24"]),
    ("a[1-3]b[1-2]", ["a1b1", "a1b2", "a2b1", "a2b2", "a3b1", "a3b2"]),
    ("a-[1-2]", ["a-1", "a-2"]),
    ("x[1,2],,y", ["x1", "x2", "y"]),
    (" a , b", ["a", "b"]),
    ("n1 n2", ["n1", "n2"]),
    ("n[1-2],n1", ["n1", "n2", "n1"]),
    ("n[0-1]", ["n0", "n1"]),
    ("", []),
]
SUFFIXES = [
    # Slurm 22.05's scontrol refuses text after the last group; newer tools accept it
    ("n[1-3]x", ["n1x", "n2x", "n3x"]),
    ("n[1-2]y[05-06]z", ["n1y05z", "n1y06z", "n2y05z", "n2y06z"]),
    ("a[1,3-4]b[2-3]c,d", ["a1b2c", "a1b3c", "a3b2c", "a3b3c", "a4b2c", "a4b3c", "d"]),
]
BAD = ["n[2-1]", "n[a-b]", "n[]", "n[1-2", "n[1-2]]", "n[1-[2-3]]", "n[1-10:2]", "n[²]"]


@pytest.mark.parametrize(("hostlist", "names"), CASES + SUFFIXES)
def test_expand(hostlist: str, names: list[str]) -> None:
    assert expand(hostlist) == names
    assert expand_nodelist(hostlist) == names


@pytest.mark.parametrize("hostlist", BAD)
def test_invalid_hostlists_are_refused(hostlist: str) -> None:
    with pytest.raises(HostlistError, match="hostlist"):
        expand(hostlist)


def test_huge_ranges_are_refused_not_expanded() -> None:
    with pytest.raises(HostlistError, match="too long"):
        expand("n[0-99999999999]")
    with pytest.raises(HostlistError, match="more than"):
        expand("a[0-999]b[0-999]c[0-9]")


def test_first() -> None:
    assert first("gpu-a[003-004],n1") == "gpu-a003"
    with pytest.raises(HostlistError):
        first(",")


@pytest.mark.parametrize(
    ("spec", "counts"),
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,2(x2)", [1, 2, 2]), ("3(x1)", [3])],
)
def test_tasks_per_node(spec: str, counts: list[int]) -> None:
    assert tasks_per_node(spec) == counts


@pytest.mark.parametrize("spec", ["", "2(x)", "x", "2(3)", "2,,1"])
def test_bad_tasks_per_node(spec: str) -> None:
    with pytest.raises(HostlistError, match="tasks-per-node"):
        tasks_per_node(spec)


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm is not installed")
def test_same_as_scontrol(tmp_path: Path) -> None:
    """Every valid case expands as Slurm's own ``scontrol show hostnames`` does, and every
    case hpcorch refuses Slurm refuses too (no controller needed: scontrol only parses)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\n")
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}

    def scontrol(hostlist: str) -> list[str] | None:
        res = subprocess.run(
            ["scontrol", "show", "hostnames", hostlist],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        out = res.stdout.split()
        return None if "Invalid hostlist" in res.stdout + res.stderr else out

    for hostlist, names in CASES:
        if hostlist.strip():
            assert scontrol(hostlist) == names, hostlist
    for hostlist in ["n[2-1]", "n[a-b]", "n[]", "n[1-2]]", "n[1-10:2]"]:
        assert scontrol(hostlist) is None, hostlist
