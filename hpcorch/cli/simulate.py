"""``hpcorch simulate``: trace-driven simulation of scheduling policies."""

from __future__ import annotations

import click


@click.command()
def simulate() -> None:
    """Simulate scheduling policies on workload traces."""
    raise click.UsageError("not implemented yet")
