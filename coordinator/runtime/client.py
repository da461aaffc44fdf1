"""HacoClient: the SDK agent code calls. It is the coordinator, in the caller's process.

    client = HacoClient()                       # HACO_* settings, running services
    result = client.invoke("coder", "plot the sales by month")
    result.output, result.zone, result.members  # winner's output and every member

Errors come from one tree (:mod:`coordinator.errors`): ``InputError`` for a bad call,
``HedgeError`` (``AllFailedError``, ``DeadlineError``, ``NotIdempotentError``,
``WinnerConflictError``) when the invocation produced no result,
``ServiceError``/``StoreError`` when the services fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis
from pydantic import ValidationError

from coordinator.config import HacoSettings
from coordinator.core.params import PolicyParams
from coordinator.errors import InputError, ServiceError, describe_validation_error
from coordinator.runtime import aio, streaming
from coordinator.runtime.coordinator import Coordinator, InvocationResult
from coordinator.runtime.dispatch import CeleryDispatcher, sending_app
from coordinator.runtime.handles import InvocationHandle, Submitter
from coordinator.runtime.pool import Pool, pool_from_settings
from coordinator.services.embedded_redis import discover
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.state.budget import RedisBudget
from coordinator.state.hedgedelay import RedisDelayWindow
from coordinator.state.lean import close_lean, lean_for
from coordinator.state.store import RedisStore
from schemas.enums import LaunchMode, WinnerMode
from schemas.models import Message, RoleInvocation
from schemas.pool import PoolConfig

Messages = str | Sequence[Message | dict[str, Any]]


def service_url(settings: HacoSettings) -> str:
    """HACO_REDIS_URL, or the embedded server that `haco up` runs in the state dir."""
    if settings.redis_url:
        return settings.redis_url
    found = discover(settings.state_dir)
    if found is None:
        raise ServiceError(
            f"no HACO services: HACO_REDIS_URL is unset and no embedded server runs under "
            f"{str(settings.state_dir)!r}; start them with `haco up`"
        )
    return found


def _messages(messages: Messages) -> list[Message]:
    if isinstance(messages, str):
        return [Message(role="user", content=messages)]
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]


class HacoClient:
    def __init__(
        self,
        settings: HacoSettings | None = None,
        pool: PoolConfig | None = None,
        redis_url: str | None = None,
        params: PolicyParams | None = None,
    ) -> None:
        self.settings = settings or HacoSettings()
        url = redis_url or service_url(self.settings)
        self.pool = Pool(pool or pool_from_settings(self.settings))
        self.redis = redis.Redis.from_url(with_db(url, keys.APP_DB))
        lean_for(self.redis, self.settings.redis_hot_connections)
        self.app = sending_app(self.settings, url)
        self.store = RedisStore(self.redis, view_max_age_s=self.settings.profile_view_max_age_s)
        self.coordinator = Coordinator(
            self.pool,
            self.store,
            CeleryDispatcher(
                self.app,
                self.pool.zones,
                app_db=keys.APP_DB,
                hot_connections=self.settings.redis_hot_connections,
            ),
            RedisBudget(self.redis, self.settings),
            RedisDelayWindow(self.redis, self.settings),
            self.settings,
            params=params,
        )
        # ainvoke(), InvocationHandle.aresult(): one reply hub per event loop
        # (coordinator.runtime.aio), no thread and no Redis connection per awaited call.
        self.hubs = aio.Hubs(with_db(url, keys.APP_DB), self.settings)
        # submit(): background invocations whose outcomes any process can collect.
        self.submitter = Submitter(
            self.store, self.coordinator.invoke, self.settings, hubs=self.hubs
        )

    def invocation(
        self,
        role: str,
        messages: Messages,
        *,
        tau: float | None = None,
        deadline_s: float | None = None,
        launch_mode: LaunchMode | str | None = None,
        winner_mode: WinnerMode | str | None = None,
        idempotent: bool = True,
        idempotency_key: str | None = None,
        require_hedge: bool = False,
    ) -> RoleInvocation:
        """Validate a call into a RoleInvocation; every problem names its value."""
        try:
            return RoleInvocation(
                role=role,
                payload=_messages(messages),
                tau=tau,
                deadline_s=deadline_s,
                launch_mode=LaunchMode(launch_mode) if launch_mode else None,
                winner_mode=WinnerMode(winner_mode) if winner_mode else None,
                idempotent=idempotent,
                idempotency_key=idempotency_key,
                require_hedge=require_hedge,
            )
        except ValidationError as exc:
            raise InputError(describe_validation_error(exc, "invocation")) from exc
        except ValueError as exc:
            raise InputError(f"invocation: {exc}") from exc

    def invoke(self, role: str, messages: Messages, **options: Any) -> InvocationResult:
        return self.coordinator.invoke(self.invocation(role, messages, **options))

    async def ainvoke(self, role: str, messages: Messages, **options: Any) -> InvocationResult:
        """invoke as a coroutine: planning and sends run on the event loop (short Redis
        and broker calls); the replies are awaited on the loop's reply hub."""
        inv = self.invocation(role, messages, **options)
        # Shielded: a cancelled caller leaves the group to run to its close.
        return await aio.shielded(aio.ainvoke(self.coordinator, self.hubs.current(), inv))

    def astream(
        self, role: str, messages: Messages, **options: Any
    ) -> AsyncIterator[streaming.StreamEvent]:
        """A relayed stream: the first member to produce a token wins it
        (coordinator.runtime.streaming)."""
        inv = self.invocation(role, messages, **options)
        return streaming.astream(self.coordinator, self.hubs.current(), self.hubs.url, inv)

    async def aclose(self) -> None:
        """Close the running loop's reply hub, then the client (:meth:`close`)."""
        await self.hubs.aclose()
        await asyncio.to_thread(self.close)

    def submit(self, role: str, messages: Messages, **options: Any) -> InvocationHandle:
        """Validate and accept the call, run it in the background, return at once; the
        handle's id is the hedge group's id (collect it here or with :meth:`handle`)."""
        inv = self.invocation(role, messages, **options)
        self.pool.candidates(inv.role)  # an unknown role fails now, not in the outcome
        return self.submitter.submit(inv)

    def handle(self, invocation_id: str) -> InvocationHandle:
        """A submitted invocation, from any process using the same Redis."""
        return InvocationHandle(invocation_id, self.store, self.settings, self.hubs)

    def close(self) -> None:
        self.submitter.close()  # accepted invocations finish and store their outcomes
        self.coordinator.close()  # pending records of lost members: dropped
        close_lean(self.redis)
        self.redis.close()
        self.app.close()

    def __enter__(self) -> HacoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
