"""`haco serve`: the coordinator service (coordinator/api/) on uvicorn: OpenAI-compatible
chat completions and native invocations over HTTP, against the running services."""

from __future__ import annotations

from typing import Annotated

import typer

from coordinator.cli.common import clean_errors, err
from coordinator.config import HacoSettings
from coordinator.errors import InputError


@clean_errors
def serve_cmd(
    host: Annotated[str | None, typer.Option(help="Address to bind (HACO_API_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (HACO_API_PORT)")] = None,
) -> None:
    """Serve HACO over HTTP: POST /v1/chat/completions (model = a role), /v1/invocations,
    GET /v1/models, /v1/profiles, /healthz, /readyz. Bearer tokens: HACO_API_TOKENS."""
    import uvicorn  # the server and the app's imports: only for this command

    from coordinator.api.app import create_app

    settings = HacoSettings()
    if port is not None and not 0 <= port <= 65_535:
        raise InputError(f"--port={port}; expected a port number in [0, 65535]")
    bind_host = host or settings.api_host
    bind_port = settings.api_port if port is None else port
    err.print(f"haco serve: http://{bind_host}:{bind_port} (OpenAI base_url: …/v1)")
    uvicorn.run(create_app(settings), host=bind_host, port=bind_port, log_level="info")


def register_serve(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
