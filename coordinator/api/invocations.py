"""The native routes: POST /v1/invocations answers the whole result (every member's
candidate, zone, rank, status, latency, reason and tokens), or with ``wait: false`` a 202
with the invocation's id at once; GET /v1/invocations/{id} gives its state and, once
done, its result or its error (any process of the service can answer: outcomes are in
Redis)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from coordinator.api.convert import headers, native, to_messages
from coordinator.api.deps import client_of, invoke
from coordinator.api.errors import INVOCATION_HEADER, classify
from coordinator.errors import UnknownInvocationError
from coordinator.runtime.outcome import InvocationState
from schemas.openai_api import Accepted, Failed, InvocationOut, InvocationRequest

router = APIRouter(prefix="/v1")


@router.post("/invocations", response_model=InvocationOut, status_code=200)
async def create(body: InvocationRequest, request: Request) -> JSONResponse:
    client = client_of(request)
    client.pool.candidates(body.role)  # UnknownRoleError (404) before any work
    messages = to_messages(body.messages)
    if not body.wait:
        handle = await asyncio.to_thread(client.submit, body.role, messages, **body.call_options())
        where = {INVOCATION_HEADER: handle.id, "location": f"/v1/invocations/{handle.id}"}
        accepted = Accepted(id=handle.id, status="pending")
        return JSONResponse(accepted.model_dump(), status_code=202, headers=where)
    result = await invoke(request, body.role, messages, body.call_options())
    return JSONResponse(native(result).model_dump(), headers=headers(result))


@router.get("/invocations/{invocation_id}")
async def invocation(invocation_id: str, request: Request) -> JSONResponse:
    handle = client_of(request).handle(invocation_id)  # InputError (400) for a bad id
    status = await asyncio.to_thread(handle.status)
    where = {INVOCATION_HEADER: handle.id}
    if status.state is InvocationState.UNKNOWN:
        raise UnknownInvocationError(
            f"unknown invocation {invocation_id!r}: never submitted, or its record expired"
        )
    if status.state is not InvocationState.DONE:
        pending = Accepted(id=handle.id, status=status.state.value)
        return JSONResponse(pending.model_dump(), headers=where)
    if status.result is not None:
        return JSONResponse(native(status.result).model_dump(), headers=headers(status.result))
    assert status.error is not None  # a done outcome holds exactly one
    _, error = classify(status.error.exception())
    return JSONResponse(Failed(id=handle.id, error=error).model_dump(), headers=where)
