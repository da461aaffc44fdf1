"""GET /v1/profiles[?role=R]: the effective experience profiles of the pool's candidates
(snapshot + online deltas), as `haco profiles` prints them."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from fastapi import APIRouter, Query, Request

from coordinator.api.deps import client_of
from coordinator.core.evidence import link_id
from coordinator.errors import StoreError
from coordinator.runtime.client import HacoClient
from coordinator.runtime.profile_view import profile_rows
from coordinator.state.epochs import snapshot_meta

router = APIRouter(prefix="/v1")


def _read(client: HacoClient, role: str | None) -> dict[str, Any]:
    pool = client.pool
    roles = [role] if role is not None else sorted(pool.by_role)
    cands = [c for r in roles for c in pool.candidates(r)]  # UnknownRoleError: 404
    caller = pool.config.caller_zone
    links = sorted({link_id(caller, c.zone) for c in cands})
    view = client.store.load_view([c.id for c in cands], links)
    try:
        meta = snapshot_meta(client.redis)
    except redis.RedisError as exc:
        raise StoreError(f"redis failed to read the profile snapshot: {exc}") from exc
    rows = [row for r in roles for row in profile_rows(pool.candidates(r), caller, view)]
    return {"object": "list", "snapshot": meta, "epoch": view.epoch, "data": rows}


@router.get("/profiles")
async def profiles(
    request: Request, role: str | None = Query(default=None, max_length=128)
) -> dict[str, Any]:
    return await asyncio.to_thread(_read, client_of(request), role)
