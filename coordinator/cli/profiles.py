"""Profile commands of `haco`: profiles (the effective profiles), recompute (one now),
beat (the periodic recompute: Celery beat with a worker on the maintenance queue)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from coordinator.cli.common import clean_errors, err, show
from coordinator.config import HacoSettings
from coordinator.core.evidence import link_id
from coordinator.errors import StoreError
from coordinator.runtime.profile_view import profile_rows
from coordinator.state import keys
from coordinator.state.broker import with_db

if TYPE_CHECKING:
    import redis


def _redis(settings: HacoSettings) -> redis.Redis:
    """The application database (tests replace this)."""
    import redis

    from coordinator.runtime.client import service_url

    return redis.Redis.from_url(with_db(service_url(settings), keys.APP_DB))


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def _table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for col in ("candidate", "zone", "μ ± σ", "ρ", "fail int/net/ddl", "p50 s", "p95 s",
                "calls", "last seen", "snapshot"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("candidate", "zone", "last seen") else "right")
    for r in rows:
        fails = "/".join(f"{r[k]:.1%}" for k in ("fail_internal", "fail_network", "fail_deadline"))
        t.add_row(
            r["candidate"], r["zone"], f"{r['mu']:.3f} ± {r['sigma']:.3f}", f"{r['rho']:.3f}",
            fails, _fmt(r["latency_p50_s"]), _fmt(r["latency_p95_s"]), f"{r['calls']:.0f}",
            r["last_seen"] or "—", str(r["snapshot_version"] or "—"),
        )  # fmt: skip
    return t


@clean_errors
def profiles_cmd(
    role: Annotated[str | None, typer.Option(help="Only this role's candidates")] = None,
) -> None:
    """The effective experience profiles (snapshot + online deltas) of the pool: a table
    on stderr, JSON on stdout."""
    import redis

    from coordinator.runtime.pool import Pool, pool_from_settings
    from coordinator.state.epochs import snapshot_meta
    from coordinator.state.store import RedisStore

    settings = HacoSettings()
    pool = Pool(pool_from_settings(settings))
    roles = [role] if role is not None else sorted(pool.by_role)
    cands = [c for r in roles for c in pool.candidates(r)]
    caller = pool.config.caller_zone
    client = _redis(settings)
    try:
        store = RedisStore(client)
        view = store.load_view(
            [c.id for c in cands], sorted({link_id(caller, c.zone) for c in cands})
        )
        meta = snapshot_meta(client)
    except redis.RedisError as exc:
        raise StoreError(f"redis failed to read the profile snapshot: {exc}") from exc
    finally:
        client.close()
    rows = [row for r in roles for row in profile_rows(pool.candidates(r), caller, view)]
    version = (
        f"snapshot v{view.version} (epoch {view.snapshot_epoch})" if view.version else "no snapshot"
    )
    show(_table(rows, f"profiles — {version}, online epoch {view.epoch}, caller zone {caller}"))
    print(json.dumps({"snapshot": meta, "epoch": view.epoch, "profiles": rows}, indent=2))


@clean_errors
def recompute_cmd() -> None:
    """Recompute the profiles from the trace store now and publish the snapshot (what the
    beat task haco.recompute does every HACO_RECOMPUTE_INTERVAL_S)."""
    import redis

    from coordinator.runtime.pool import configured_domain_pools
    from coordinator.services import embedded_pg
    from coordinator.tracestore.recompute import recompute_once

    settings = HacoSettings()
    pools = configured_domain_pools(settings, err.print)
    client = _redis(settings)
    try:
        url = embedded_pg.trace_store_url(settings)
        result = recompute_once(client, url, settings, pools=pools)
    except redis.RedisError as exc:
        raise StoreError(f"redis failed during the recompute: {exc}") from exc
    finally:
        client.close()
    if result.version is None and not result.adopted:
        err.print("another recompute holds the lock (or published a later epoch): skipped")
    else:
        err.print(
            f"snapshot v{result.version}: epoch {result.epoch}, watermark {result.watermark}, "
            f"{result.candidates} candidates, {result.links} links; waited {result.wait_s:.2f} s "
            f"for the harvester, aggregated in {result.aggregate_s:.2f} s"
        )
    print(json.dumps(result.to_dict(), indent=2))


@clean_errors
def beat_cmd() -> None:
    """Run Celery beat and a worker of the haco.maintenance queue in one process: the
    profile recompute every HACO_RECOMPUTE_INTERVAL_S (needs the trace store)."""
    from coordinator.runtime.client import service_url
    from workers.app import create_app
    from workers.maintenance import beat_argv

    settings = HacoSettings()
    create_app(settings, service_url(settings)).worker_main(beat_argv(settings))


def register_profiles(app: typer.Typer) -> None:
    app.command("profiles")(profiles_cmd)
    app.command("recompute")(recompute_cmd)
    app.command("beat")(beat_cmd)
