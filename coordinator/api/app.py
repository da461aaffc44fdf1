"""The coordinator service: HACO over HTTP (`haco serve`). ``create_app(settings)`` builds
the FastAPI app; its HacoClient (the coordinator, in this process) is the one given, or
one made at startup and closed at shutdown.

Routes: POST /v1/chat/completions and GET /v1/models (OpenAI-compatible; ``model`` names
a role), POST /v1/invocations (native, every member's outcome), GET /v1/profiles,
GET /v1/invocations/{id}, GET /healthz, GET /readyz, GET /metrics (Prometheus,
coordinator/api/metrics.py), GET /dashboard and its data GET /v1/dashboard
(coordinator/api/dashboard.py). Auth and the body-size limit: coordinator/api/guard.py; error
answers: coordinator/api/errors.py.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from coordinator.api import chat, dashboard, health, invocations, profiles
from coordinator.api.errors import install_error_handlers
from coordinator.api.guard import Guard, parse_tokens
from coordinator.api.health import Readiness
from coordinator.api.metrics import ApiMetrics, metrics_response
from coordinator.config import HacoSettings
from coordinator.runtime.client import HacoClient

log = logging.getLogger("haco.api")


def _attach(app: FastAPI, client: HacoClient, settings: HacoSettings) -> None:
    """The client the routes use, its readiness check and the service's metrics."""
    app.state.client = client
    app.state.readiness = Readiness(client, settings)
    app.state.metrics = ApiMetrics(
        delays=client.coordinator.delays,
        budget=client.coordinator.budget,
        roles=sorted(client.pool.by_role),
        settings=settings,
    )


def _metrics(request: Request) -> Response:
    """GET /metrics (Prometheus; a sync endpoint: the scrape reads Redis in a thread)."""
    return metrics_response(request.app.state.metrics)


def create_app(settings: HacoSettings, client: HacoClient | None = None) -> FastAPI:
    """The service's app. A ``client`` given is the caller's to close."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = client is None
        if client is None:
            _attach(app, HacoClient(settings), settings)
        if not parse_tokens(settings.api_tokens):
            log.warning("HACO_API_TOKENS is unset: the API is open to every caller")
        try:
            yield
        finally:
            if own:
                await app.state.client.aclose()
            else:  # the caller closes its client; the reply hub of this loop closes here
                await app.state.client.hubs.aclose()

    app = FastAPI(title="HACO coordinator", lifespan=lifespan)
    app.state.settings = settings
    if client is not None:  # usable without the lifespan (an ASGI transport in tests)
        _attach(app, client, settings)
    for module in (chat, invocations, profiles, health, dashboard):
        app.include_router(module.router)
    app.router.routes.append(Route("/metrics", _metrics, methods=["GET"], include_in_schema=False))
    install_error_handlers(app)
    app.add_middleware(Guard, settings=settings)
    return app
