"""A command's options from a TOML file (stdlib ``tomllib``): ``--config FILE``.

The file's keys are the command's long option names without the dashes in front
(``restart-cost = 30``; ``restart_cost`` is accepted too); an option given on the command
line overrides the file. A key the command does not have, or a value its option refuses,
is one error naming the file, the key and what is valid. Values go through the options'
own types, so the file is checked exactly as the command line is.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any, TypeVar

import click

from hpcorch.cli import params

F = TypeVar("F", bound=Callable[..., Any])

NOT_IN_FILE = frozenset({"config", "help", "once"})
"""Options that only make sense on a command line."""


def config_keys(command: click.Command) -> dict[str, click.Option]:
    """The keys a configuration file of ``command`` may hold, each with its option."""
    keys: dict[str, click.Option] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.name in NOT_IN_FILE:
            continue
        longs = [o for o in param.opts if o.startswith("--")]
        if longs:
            keys[longs[0][2:]] = param
    return keys


def read_config(path: str, command: click.Command, ctx: click.Context) -> dict[str, Any]:
    """``{parameter name: value}`` from the TOML file at ``path``, checked against the
    options of ``command``; a ``click.BadParameter`` with one clear line otherwise."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{path} is not valid TOML: {exc}") from None
    keys = config_keys(command)
    values: dict[str, Any] = {}
    for raw_key, value in doc.items():
        key = raw_key.replace("_", "-")
        option = keys.get(key)
        if option is None or option.name is None:
            raise click.BadParameter(
                f"unknown key {raw_key!r} in {path} (valid: {', '.join(sorted(keys))})"
            )
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)  # users = ["alice", "@dl"] as on the command line
        if isinstance(value, dict | list) or (
            not isinstance(value, str | int | float | bool) and not option.is_flag
        ):
            raise click.BadParameter(f"{path}: {raw_key} = {value!r} is not a single value")
        try:
            option.type_cast_value(ctx, value)
        except click.BadParameter as exc:
            raise click.BadParameter(f"{path}: {raw_key} = {value!r}: {exc.message}") from None
        values[option.name] = value
    return values


def config_option(envvar: str) -> Callable[[F], F]:
    """``--config FILE`` (or ``envvar``): the command's options from a TOML file."""

    def load(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        if value:
            assert ctx.command is not None
            defaults = dict(ctx.default_map or {})
            defaults.update(read_config(value, ctx.command, ctx))
            ctx.default_map = defaults
        return value

    return click.option(
        "--config",
        type=params.PathType(dir_okay=False),
        envvar=envvar,
        is_eager=True,
        expose_value=False,
        callback=load,
        help=f"TOML file of these options (keys: the option names, e.g. restart-cost = 30); "
        f"options given here override it [env: {envvar}].",
    )
