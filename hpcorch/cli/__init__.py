"""The ``hpcorch`` command line. Each command group lives in its own module, imported only
when its command runs: ``hpcorch submit`` does not pay for the simulator's imports."""

from __future__ import annotations

import importlib
import os
from typing import Any

import click

from hpcorch import __version__
from hpcorch.errors import HpcorchError

COMMANDS = {
    "submit": "hpcorch.cli.jobs:submit",
    "status": "hpcorch.cli.status:status",
    "cancel": "hpcorch.cli.status:cancel",
    "logs": "hpcorch.cli.logs:logs",
    "controller": "hpcorch.cli.controller:controller",
    "describe": "hpcorch.cli.describe:describe",
    "resize": "hpcorch.cli.pin:resize",
    "metrics": "hpcorch.cli.metrics:metrics",
    "simulate": "hpcorch.cli.simulate:simulate",
    "report": "hpcorch.cli.report:report",
}


ONE_THREAD = ("simulate", "controller")
"""Commands whose numpy runs with one BLAS/OpenMP thread unless the environment says
otherwise: their arrays are small, and on a loaded machine BLAS threads spin (a simulation
took twice the CPU for the same results)."""
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        if cmd_name in ONE_THREAD:  # before numpy is imported: it reads them once
            for var in THREAD_VARS:
                os.environ.setdefault(var, "1")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; an error no command turned into a message still ends in one
        ``Error:`` line, not a traceback (HPCORCH_DEBUG=1 shows the traceback)."""
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except HpcorchError as exc:
            raise click.ClickException(str(exc)) from None
        except BrokenPipeError:
            raise  # the reader left (`| head`): click exits quietly, as other tools do
        except OSError as exc:
            if os.environ.get("HPCORCH_DEBUG"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from None
        except Exception as exc:
            if os.environ.get("HPCORCH_DEBUG"):
                raise
            text = str(exc).splitlines()[0] if str(exc) else ""
            raise click.ClickException(
                f"internal error ({type(exc).__name__}: {text[:200]}); please report it "
                "(HPCORCH_DEBUG=1 shows where)"
            ) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcorch")
def main() -> None:
    """hpcorch: elastic batch-size orchestration of deep-learning training on Slurm."""
