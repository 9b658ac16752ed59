"""The ``hpcorch`` command line. Each command group lives in its own module, imported only
when its command runs: ``hpcorch submit`` does not pay for the simulator's imports."""

from __future__ import annotations

import importlib

import click

from hpcorch import __version__

COMMANDS = {
    "submit": "hpcorch.cli.jobs:submit",
    "status": "hpcorch.cli.status:status",
    "cancel": "hpcorch.cli.status:cancel",
    "logs": "hpcorch.cli.logs:logs",
    "controller": "hpcorch.cli.controller:controller",
    "describe": "hpcorch.cli.controller:describe",
    "resize": "hpcorch.cli.controller:resize",
    "metrics": "hpcorch.cli.controller:metrics",
    "simulate": "hpcorch.cli.simulate:simulate",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcorch")
def main() -> None:
    """hpcorch: elastic batch-size orchestration of deep-learning training on Slurm."""
