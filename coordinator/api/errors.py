"""OpenAI-style error answers, ``{"error": {"message", "type", "param", "code"}}``, for
every failure the service reports: a client mistake is a 4xx, never a 5xx.

HACO's error tree maps to statuses here: InputError 400, UnknownRoleError 404,
NotIdempotentError / WinnerConflictError 409, AllFailedError 502 and DeadlineError 504
(each member's reason attached), StoreError / ServiceError / DatabaseError 503.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from coordinator.errors import (
    AllFailedError,
    DatabaseError,
    DeadlineError,
    HacoError,
    HedgeError,
    InputError,
    NotIdempotentError,
    ServiceError,
    StoreError,
    UnknownInvocationError,
    UnknownRoleError,
    WinnerConflictError,
    describe_validation_error,
)
from schemas.openai_api import ErrorBody, ErrorResponse

INVOCATION_HEADER = "x-haco-invocation-id"

# (status, type, code) per HACO error class, most specific first.
_HACO_STATUS: list[tuple[type[HacoError], int, str, str]] = [
    (UnknownRoleError, 404, "invalid_request_error", "model_not_found"),
    (UnknownInvocationError, 404, "invalid_request_error", "invocation_not_found"),
    (InputError, 400, "invalid_request_error", "invalid_value"),
    (AllFailedError, 502, "upstream_error", "all_failed"),
    (DeadlineError, 504, "upstream_error", "deadline_exceeded"),
    (NotIdempotentError, 409, "invalid_request_error", "not_idempotent"),
    (WinnerConflictError, 409, "conflict_error", "winner_conflict"),
    (StoreError, 503, "service_unavailable", "store_unavailable"),
    (ServiceError, 503, "service_unavailable", "service_unavailable"),
    (DatabaseError, 503, "service_unavailable", "database_unavailable"),
]
_HTTP_TYPES = {
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    extra: dict[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(message=message, type=kind, param=param, code=code))
    content = body.model_dump()
    content["error"].update(extra or {})
    return JSONResponse(content, status_code=status, headers=headers)


def classify(exc: HacoError) -> tuple[int, dict[str, Any]]:
    """The HTTP status of a HACO error and its OpenAI-style error object (with each
    member's reason for all-failed and deadline errors)."""
    status, kind, code = 500, "server_error", "internal_error"
    for cls, s, k, c in _HACO_STATUS:
        if isinstance(exc, cls):
            status, kind, code = s, k, c
            break
    body = ErrorBody(message=str(exc), type=kind, code=code).model_dump()
    if isinstance(exc, AllFailedError | DeadlineError):
        body["failures"] = exc.failures
    return status, body


def haco_error_response(exc: HacoError) -> JSONResponse:
    status, body = classify(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, HedgeError) and exc.group_id:
        headers[INVOCATION_HEADER] = exc.group_id
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _param(exc: RequestValidationError) -> str | None:
    errors = exc.errors()
    if not errors:
        return None
    loc = [str(p) for p in errors[0].get("loc", ()) if p != "body"]
    return ".".join(loc) or None


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(
        400, describe_validation_error(exc, "request"), code="invalid_value", param=_param(exc)
    )


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind, code = _HTTP_TYPES.get(exc.status_code, ("invalid_request_error", None))
    if exc.status_code >= 500:
        kind, code = "server_error", None
    return error_response(exc.status_code, str(exc.detail), kind, code, headers=exc.headers)


async def _on_haco(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HacoError)
    return haco_error_response(exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(HacoError, _on_haco)
