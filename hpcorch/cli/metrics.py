"""``hpcorch metrics``: the controller's state as Prometheus metrics."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import suppress

import click

from hpcorch.cli import params
from hpcorch.cli.controller import state_dir_option
from hpcorch.controller.store import Store
from hpcorch.errors import HpcorchError
from hpcorch.paths import STATE_DB, controller_dir


def _open_store(state_dir: str | None) -> Store:
    path = controller_dir(state_dir) / STATE_DB
    if path.exists() and not os.access(path, os.R_OK):
        raise click.ClickException(
            f"cannot read the controller's state {path}: permission denied (ask the site for "
            "read access, e.g. the controller's group)"
        )
    try:
        return Store(path, readonly=True)
    except HpcorchError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@click.argument("job_id", required=False, type=params.JOB_ID)
@click.option("--listen", type=params.Integer(1, 65535), help="Serve them on this port instead.")
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    type=params.Address(),
    help="Address to serve them on.",
)
@state_dir_option
def metrics(job_id: int | None, listen: int | None, address: str, state_dir: str | None) -> None:
    """Prometheus metrics: print once (JOB_ID: only its per-job series; a user sees their
    own jobs'), or serve them with --listen PORT (needs prometheus-client: pip install
    'hpcorch[prometheus]')."""
    from hpcorch.cli.poolview import metrics_text
    from hpcorch.controller import prom

    path = controller_dir(state_dir) / STATE_DB
    try:
        if listen is None:
            click.echo(metrics_text(controller_dir(state_dir), job_id), nl=False)
            return
        if job_id is not None:
            raise click.UsageError("--listen serves every job's metrics: give no JOB_ID")
        _open_store(state_dir).close()  # fail now, clearly, if there is no state
        reg = prom.registry(lambda: Store(path, readonly=True))
        server, thread = prom.client().start_http_server(listen, address, registry=reg)
    except HpcorchError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {address}:{listen}: {exc.strerror}") from exc
    click.echo(f"serving metrics on http://{address}:{listen}/metrics", err=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with suppress(KeyboardInterrupt):
        stop.wait()
    server.shutdown()
    thread.join(5)
