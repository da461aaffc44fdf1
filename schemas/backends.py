"""Typed settings of the real model backends (``backend.kind`` ``openai`` and ``azure``).

A candidate's ``[candidates.backend.settings]`` table in the pool config is validated
against the model of its kind when the pool loads (:class:`schemas.models.BackendSpec`),
so a typo in a URL, a timeout or an unknown key fails there, named. The worker builds
the backend from the same model (``workers.backends.openai``).

The API key is never in the config: ``api_key_env`` names the environment variable the
worker reads at call time. Nothing HACO writes (traces, logs, Redis, metrics, errors,
exported JSON) ever holds the key.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

Seconds = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
HttpUrl = Annotated[str, Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]


# Request fields the backend fills from the task and the settings above.
RESERVED_BODY_FIELDS = frozenset(
    {"messages", "model", "stream", "stream_options", "max_tokens", "temperature"}
)


class _EndpointSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The environment variable holding the API key, read by the worker at call time;
    # None: the endpoint takes no key (a local server).
    api_key_env: EnvName | None = None
    # Server-sent events (``stream: true``, with the usage in the final chunk), or one
    # JSON body. Both are read incrementally and can be cancelled.
    stream: bool = False
    # Timeouts: to open the connection (and to get a pooled one), between two reads of
    # the response (also the wait for the headers), and for the whole call.
    connect_timeout_s: Seconds = 5.0
    read_timeout_s: Seconds = 60.0
    total_timeout_s: Seconds = 300.0
    # While no byte arrives, the cancel flag is checked this often.
    stop_poll_s: Seconds = 0.05
    # Sampling; None leaves max_tokens to the server, temperature to the candidate's.
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    # A 429 sets the candidate's cooldown to its Retry-After (or retry-after-ms), capped
    # at cooldown_max_s; cooldown_default_s when the response names none.
    cooldown_default_s: Seconds = 1.0
    cooldown_max_s: Seconds = 300.0
    # More fields of the request body, as the OpenAI SDK's ``extra_body``: what a server
    # takes beyond the common ones (``response_format`` with a JSON schema, ``seed``,
    # ``top_p``…). The fields HACO sets itself cannot be overridden here.
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _own_fields(self) -> _EndpointSettings:
        taken = sorted(set(self.extra_body) & RESERVED_BODY_FIELDS)
        if taken:
            raise ValueError(
                f"extra_body sets {taken}, which HACO sets itself; expected other fields"
            )
        return self

    @model_validator(mode="after")
    def _timeouts(self) -> _EndpointSettings:
        if self.total_timeout_s < self.connect_timeout_s:
            raise ValueError(
                f"total_timeout_s={self.total_timeout_s} is below "
                f"connect_timeout_s={self.connect_timeout_s}"
            )
        return self


class OpenAISettings(_EndpointSettings):
    """Any OpenAI-compatible server: POST ``{base_url}/chat/completions`` with
    ``Authorization: Bearer <key>``."""

    base_url: HttpUrl
    model: str | None = Field(default=None, min_length=1)  # None: the candidate's model


class AzureSettings(_EndpointSettings):
    """Azure OpenAI: POST ``{endpoint}/openai/deployments/{deployment}/chat/completions
    ?api-version=…`` with an ``api-key`` header."""

    endpoint: HttpUrl
    deployment: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    api_version: str = Field(default="2024-06-01", pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[a-z-]*$")


ENDPOINT_SETTINGS: dict[str, type[_EndpointSettings]] = {
    "openai": OpenAISettings,
    "azure": AzureSettings,
}
"""``backend.kind`` → the model its settings must satisfy."""
