"""The OpenAI-compatible routes: POST /v1/chat/completions (``model`` names a role) and
GET /v1/models (the roles)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from coordinator.api.convert import completion, headers, to_messages
from coordinator.api.deps import client_of, invoke
from coordinator.api.relay import relay
from schemas.openai_api import ChatCompletion, ChatCompletionRequest, ModelList, ModelOut

router = APIRouter(prefix="/v1")


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    client = client_of(request)
    client.pool.candidates(body.model)  # UnknownRoleError (404) before any work
    options = body.haco.call_options() if body.haco else {}
    if body.stream:
        return await relay(request, body, options)
    result = await invoke(request, body.model, to_messages(body.messages), options)
    created = int(time.time())
    answer = completion(result, body.model, created)
    return JSONResponse(answer.model_dump(), headers=headers(result))


@router.get("/models", response_model=ModelList)
async def models(request: Request) -> ModelList:
    roles = sorted(client_of(request).pool.by_role)
    return ModelList(data=[ModelOut(id=role) for role in roles])
