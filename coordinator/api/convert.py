"""An InvocationResult in the service's answers: an OpenAI chat completion (and its
stream of chunks), the native result, and the x-haco-* headers."""

from __future__ import annotations

import json
from collections.abc import Iterator

from coordinator.runtime.results import InvocationResult, MemberSummary
from schemas.models import Message
from schemas.openai_api import (
    ChatCompletion,
    ChatMessage,
    Choice,
    InvocationOut,
    MemberOut,
    ResponseMessage,
    Usage,
)


def to_messages(messages: list[ChatMessage]) -> list[Message]:
    return [Message(role=m.role, content=m.text()) for m in messages]


def winner(result: InvocationResult) -> MemberSummary | None:
    return next((m for m in result.members if m.member_id == result.winner_id), None)


def headers(result: InvocationResult) -> dict[str, str]:
    return {
        "x-haco-invocation-id": result.group_id,
        "x-haco-candidate": result.candidate_id or "",
        "x-haco-zone": result.zone or "",
        "x-haco-members": ",".join(m.candidate_id for m in result.members if m.launched),
    }


def completion(result: InvocationResult, model: str, created: int) -> ChatCompletion:
    won = winner(result)
    tin, tout = (won.tokens_in, won.tokens_out) if won else (0, 0)
    return ChatCompletion(
        id=f"chatcmpl-{result.group_id}",
        created=created,
        model=model,
        choices=[Choice(message=ResponseMessage(content=result.output or ""))],
        usage=Usage(prompt_tokens=tin, completion_tokens=tout, total_tokens=tin + tout),
    )


def chunks(result: InvocationResult, model: str, created: int) -> Iterator[str]:
    """The finished winner's text as server-sent ``chat.completion.chunk`` events (a word
    per event), the usage last, then ``[DONE]``."""
    done = completion(result, model, created)
    base = {"id": done.id, "object": "chat.completion.chunk", "created": created, "model": model}

    def event(delta: dict[str, str], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"

    yield event({"role": "assistant", "content": ""})
    text = result.output or ""
    words = text.split(" ")
    for i, word in enumerate(words):
        yield event({"content": word if i == len(words) - 1 else word + " "})
    yield event({}, "stop")
    yield f"data: {json.dumps({**base, 'choices': [], 'usage': done.usage.model_dump()})}\n\n"
    yield "data: [DONE]\n\n"


def native(result: InvocationResult) -> InvocationOut:
    return InvocationOut(
        id=result.group_id,
        role=result.role,
        state=str(result.state),
        winner_id=result.winner_id,
        candidate=result.candidate_id,
        zone=result.zone,
        output=result.output,
        quality=result.quality,
        p_success=result.p_success,
        stop=str(result.stop),
        latency_s=result.latency_s,
        backups=result.backups,
        winner_rule=None if result.winner_rule is None else str(result.winner_rule),
        fallback_reason=result.fallback_reason,
        members=[member(m) for m in result.members],
    )


def member(m: MemberSummary) -> MemberOut:
    return MemberOut(
        member_id=m.member_id,
        candidate=m.candidate_id,
        zone=m.zone,
        rank=m.rank,
        status=str(m.status),
        launched=m.launched,
        latency_s=m.latency_s,
        reason=m.reason,
        tokens_in=m.tokens_in,
        tokens_out=m.tokens_out,
    )
