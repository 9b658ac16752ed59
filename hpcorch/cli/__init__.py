"""The ``hpcorch`` command line. Each command group lives in its own module."""

from __future__ import annotations

import click

from hpcorch import __version__
from hpcorch.cli.controller import controller, describe, metrics, resize
from hpcorch.cli.jobs import cancel, status, submit
from hpcorch.cli.simulate import simulate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcorch")
def main() -> None:
    """hpcorch: elastic batch-size orchestration of deep-learning training on Slurm."""


for _command in (submit, status, cancel, controller, describe, resize, metrics, simulate):
    main.add_command(_command)
