"""What the routes share: the service's HacoClient, settings and metrics (on
``app.state``), and ``invoke``, which counts an invocation's result or HedgeError."""

from __future__ import annotations

from typing import Any, cast

from fastapi import Request

from coordinator.api.metrics import ApiMetrics
from coordinator.config import HacoSettings
from coordinator.errors import HedgeError
from coordinator.runtime.client import HacoClient
from coordinator.runtime.results import InvocationResult
from schemas.models import Message


def client_of(request: Request) -> HacoClient:
    return cast(HacoClient, request.app.state.client)


def settings_of(request: Request) -> HacoSettings:
    return cast(HacoSettings, request.app.state.settings)


def metrics_of(request: Request) -> ApiMetrics:
    return cast(ApiMetrics, request.app.state.metrics)


async def invoke(
    request: Request, role: str, messages: list[Message], options: dict[str, Any]
) -> InvocationResult:
    """``HacoClient.ainvoke``, its result or HedgeError counted in the service's metrics."""
    metrics = metrics_of(request)
    try:
        result = await client_of(request).ainvoke(role, messages, **options)
    except HedgeError as exc:
        metrics.observe_error(role, exc)
        raise
    metrics.observe(result)
    return result
