"""Exceptions with messages meant for people: one line naming the problem."""

from __future__ import annotations


class HpcorchError(Exception):
    """Base of every error hpcorch reports to a user (exit code 1)."""


class SlurmUnavailable(HpcorchError):
    """Slurm's commands are missing or slurmctld does not answer."""


class SlurmCommandError(HpcorchError):
    """A Slurm command ran and failed."""


class SubmitError(HpcorchError):
    """A job cannot be submitted as requested."""
