"""How a Slurm command failed: its error line, whether slurmctld is unreachable, and a
SLURM_CONF that names no readable file (``hpcorch.slurm.backend.SlurmCLI``)."""

from __future__ import annotations

from collections.abc import Mapping

from hpcorch.errors import SlurmUnavailable


def check_slurm_conf(env: Mapping[str, str]) -> None:
    """A SLURM_CONF that names no readable file: Slurm's commands would wait up to a minute
    and then blame slurmctld; say what is wrong instead."""
    conf = env.get("SLURM_CONF")
    if conf is None:
        return
    if not conf.strip():
        raise SlurmUnavailable("SLURM_CONF is set but empty: unset it or name slurm.conf")
    try:
        with open(conf, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise SlurmUnavailable(
            f"SLURM_CONF={conf!r} cannot be read ({exc.strerror}): name this cluster's slurm.conf"
        ) from None


def first_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() or "fatal" in ln.lower():
            return ln
    return lines[0] if lines else ""


def unreachable(stderr: str) -> bool:
    text = stderr.lower()
    return any(
        s in text
        for s in (
            "unable to contact slurm controller",
            "could not establish a configuration source",
            "connection refused",
            "socket timed out",
            "unable to establish controller",
        )
    )
