"""``hpcorch submit``, ``status`` and ``cancel``."""

from __future__ import annotations

import click


@click.command()
def submit() -> None:
    """Submit a training script."""
    raise click.UsageError("not implemented yet")


@click.command()
def status() -> None:
    """Show hpcorch jobs."""
    raise click.UsageError("not implemented yet")


@click.command()
def cancel() -> None:
    """Cancel a job."""
    raise click.UsageError("not implemented yet")
