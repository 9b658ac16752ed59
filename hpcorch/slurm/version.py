"""Which Slurm the controller talks to, and what hpcorch relies on that differs by release.

The controller asks slurmctld for its version once at start (``scontrol show config``),
logs it, refuses a release outside ``SUPPORTED`` with one line, and hands the behaviour of
that release to the backend (``SlurmBehaviour``). Pure: text in, values out.

Every behaviour named here is checked against real daemons of each tested release by
``tests/integration/test_slurm_behaviour.py``; docs/admin-guide.md has the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpcorch.errors import HpcorchError

SUPPORTED = ("22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11")
"""Slurm release series hpcorch runs on (22.05, 23.11, 24.11 and 25.11 are tested against
real daemons; the series between them share their neighbours' behaviour)."""
TESTED = ("22.05", "23.11", "24.11", "25.11")

_VERSION_RE = re.compile(r"(?<![\d.])(\d{2})\.(\d{2})(?:\.(\d+))?")


class SlurmUnsupported(HpcorchError):
    """slurmctld runs a Slurm release hpcorch does not support."""


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    @property
    def series(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}"

    def __str__(self) -> str:
        return f"{self.series}.{self.micro}"


def parse_version(text: str) -> SlurmVersion:
    """The first ``YY.MM[.P]`` in ``text``: ``slurm 25.11.2``, ``slurm-wlm 22.05.8``, or
    ``scontrol show config``'s ``SLURM_VERSION = 24.11.7``; ValueError if there is none."""
    for line in text.splitlines():
        if "SLURM_VERSION" in line.upper():
            text = line
            break
    m = _VERSION_RE.search(text)
    if m is None:
        raise ValueError(f"no Slurm version in {text[:80]!r}")
    return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def check_supported(version: SlurmVersion) -> SlurmVersion:
    """``version`` if hpcorch supports its series, else SlurmUnsupported (one line)."""
    if version.series not in SUPPORTED:
        raise SlurmUnsupported(
            f"slurmctld runs Slurm {version}, which hpcorch does not support "
            f"(supported: {', '.join(SUPPORTED)}; tested: {', '.join(TESTED)})"
        )
    return version


@dataclass(frozen=True)
class SlurmBehaviour:
    """What hpcorch does differently by release (every field is a row of the admin guide's
    table of Slurm behaviours)."""

    version: SlurmVersion
    squeue_lists_ended_only_when_asked: bool
    """``squeue --json`` lists ended jobs only with ``--states=all`` (24.05+, which applies
    squeue's filters to ``--json``, the default one of pending and running jobs included;
    22.05 to 23.11 ignore every filter with ``--json`` and list each job slurmctld holds).
    hpcorch always asks for every state."""
    nodes_from_scontrol: bool
    """``sinfo --json`` groups nodes (23.02+): the node list comes from ``scontrol show
    nodes --json`` instead."""
    tres_prefix: str
    """How GRES are written in TRES fields: ``gres:gpu`` (22.05), ``gres/gpu`` (23.02+)."""
    cpus_per_gpu_sticks: bool
    """A job's first CPUs-per-GPU total outlives later updates of its GPUs (24.11 and 25.11;
    24.05 assumed alike; 23.11 and older do not): the controller never reshapes through
    ``CpusPerTres`` (hpcorch.slurm.backend.shape_args), on any release."""
    retypes_gpus: bool
    """A requeued job's GPU request may name another GPU type than its last run's (23.11,
    24.11, 25.11; 24.05 and 25.05 assumed alike). 22.05 keeps the type a job last ran with:
    a request for another type is never runnable (BadConstraints), one without a type is
    refused ("with and without type identification"), also after the request is cleared;
    23.02 assumed alike. There the controller asks for GPUs of no type on exactly the
    planned nodes, whose type they are (hpcorch.slurm.backend.SlurmCLI.set_shape)."""


def behaviour(version: SlurmVersion) -> SlurmBehaviour:
    """The behaviour of ``version`` (supported or not: see :func:`check_supported`)."""
    new_json = (version.major, version.minor) >= (23, 2)
    return SlurmBehaviour(
        version=version,
        squeue_lists_ended_only_when_asked=(version.major, version.minor) >= (24, 5),
        nodes_from_scontrol=new_json,
        tres_prefix="gres/gpu" if new_json else "gres:gpu",
        cpus_per_gpu_sticks=(version.major, version.minor) >= (24, 5),
        retypes_gpus=(version.major, version.minor) >= (23, 11),
    )
