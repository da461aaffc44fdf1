"""Request and response bodies of the coordinator service (`haco serve`, coordinator/api/):
the OpenAI chat-completions subset it speaks, and the native invocation form.

Requests are strict about what HACO reads (wrong types are 400s, never coerced) and let
the OpenAI fields it ignores (temperature, top_p, …) through.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from schemas.enums import LaunchMode, WinnerMode

Number = StrictFloat | StrictInt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(BaseModel):
    """One part of a multi-part message content; only text parts are served."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    content: StrictStr | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class HacoOptions(_Strict):
    """The per-call HACO settings: the ``haco`` object of a chat completion, the top
    level of a native invocation."""

    tau: Annotated[Number, Field(gt=0.0, lt=1.0)] | None = None
    deadline_s: Annotated[Number, Field(gt=0.0, le=86_400.0)] | None = None
    # An enum's value from JSON (the body reaches the model as Python objects: a strict
    # enum field would refuse every string).
    launch_mode: Annotated[LaunchMode, Field(strict=False)] | None = None
    winner_mode: Annotated[WinnerMode, Field(strict=False)] | None = None
    idempotency_key: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None

    def call_options(self) -> dict[str, Any]:
        """The keyword arguments of ``HacoClient.ainvoke`` that were given."""
        out = self.model_dump(include=set(HacoOptions.model_fields), exclude_none=True)
        if "tau" in out:
            out["tau"] = float(out["tau"])
        if "deadline_s" in out:
            out["deadline_s"] = float(out["deadline_s"])
        return out


Messages = Annotated[list[ChatMessage], Field(min_length=1, max_length=10_000)]


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: Annotated[StrictStr, Field(min_length=1, max_length=128)]  # the role
    messages: Messages
    stream: StrictBool = False
    haco: HacoOptions | None = None


class InvocationRequest(HacoOptions):
    role: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    messages: Messages
    # True: answer when the invocation is done; False: 202 with its id at once.
    wait: StrictBool = True


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: Literal["stop"] = "stop"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class MemberOut(BaseModel):
    member_id: str
    candidate: str
    zone: str
    rank: int
    status: str
    launched: bool
    latency_s: float | None
    reason: str | None
    tokens_in: int
    tokens_out: int


class InvocationOut(BaseModel):
    """A finished invocation: the winner and every member's outcome."""

    id: str
    status: Literal["succeeded"] = "succeeded"
    role: str
    state: str
    winner_id: str | None
    candidate: str | None
    zone: str | None
    output: str | None
    quality: float | None
    p_success: float
    stop: str
    latency_s: float
    backups: int
    winner_rule: str | None
    fallback_reason: str | None
    members: list[MemberOut]


class Accepted(BaseModel):
    """A submitted invocation (``wait: false``), or one not finished yet."""

    id: str
    status: Literal["pending", "running"]


class Failed(BaseModel):
    """A submitted invocation that ended without a result: the error, OpenAI-style."""

    id: str
    status: Literal["failed"] = "failed"
    error: dict[str, Any]


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "haco"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
