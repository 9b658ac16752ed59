"""Exceptions with messages meant for people: one line naming the problem."""

from __future__ import annotations


class HpcorchError(Exception):
    """Base of every error hpcorch reports to a user (exit code 1)."""


class SlurmUnavailable(HpcorchError):
    """Slurm's commands are missing or slurmctld does not answer."""


class SlurmCommandError(HpcorchError):
    """A Slurm command ran and failed."""


class SlurmTimeout(SlurmCommandError):
    """A Slurm command did not finish in time while slurmctld answers a ping: it kept
    waiting (a slurmctld answering slowly, or a command that retries by itself)."""


class SubmitError(HpcorchError):
    """A job cannot be submitted as requested."""
