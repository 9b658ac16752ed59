"""A command whose reader leaves early (`hpcorch ... | head`) ends quietly, as other tools
do: no "Error: Broken pipe" line, no traceback."""

from __future__ import annotations

import subprocess
import sys

CODE = r"""
import click
from hpcorch import cli

@click.command()
def many() -> None:
    for _ in range(200_000):
        click.echo("x" * 50)

cli.COMMANDS["many"] = "__main__:many"
cli.main(["many"])
"""


def test_a_reader_that_leaves_early_gets_no_error_line() -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", CODE], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.read(100)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert p.returncode != 0
    assert "Broken pipe" not in err and "Traceback" not in err, err
