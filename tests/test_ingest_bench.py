"""bench.ingest against real servers, small: every run stores every trace and counts what
its drain kept busy (the harvesters, the Postgres processes on this machine, the Redis
server, the whole machine), from which the generated report says where the curve from 1
to 2 harvesters bends (tests/test_hotpath_report.py)."""

from __future__ import annotations

import json

import pytest
import redis

from bench.ingest import main
from bench.machine import named_cpu_s
from bench.scratchdb import database_url

N = 1_500


# bench.ingest forks its harvesters, as it always has; Python 3.12+ warns about a fork in
# a process with threads (pytest's timeout thread), which is harmless here.
@pytest.mark.filterwarnings("ignore:This process .*is multi-threaded:DeprecationWarning")
def test_each_run_stores_every_trace_and_counts_the_busy_cores(
    redis_db: redis.Redis, redis_url: str, pg_admin_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--n", str(N), "--batch", "500", "--harvesters", "1", "2"]
    main([*argv, "--redis-url", redis_url, "--pg-url", pg_admin_url])
    out = json.loads(capsys.readouterr().out)
    assert [run["harvesters"] for run in out["runs"]] == [1, 2]
    postgres_here = named_cpu_s("postgres") is not None
    for run in out["runs"]:
        assert run["harvest"]["rows_stored"] == N
        busy, wall_s = run["busy_cores"], run["harvest"]["seconds"]
        assert busy["harvesters"] > 0 and busy["redis"] >= 0
        assert (busy["postgres"] is not None) is postgres_here
        assert busy["postgres"] is None or busy["postgres"] >= 0
        # The machine's busy time holds the harvesters' (read in clock ticks: 10 ms each,
        # per core, so allow a few).
        assert busy["machine"] * wall_s + 0.05 >= busy["harvesters"] * wall_s


def test_a_scratch_database_url_keeps_the_server_it_names() -> None:
    # An embedded server's URL names its socket directory in the query: it stays.
    socket = "postgresql://postgres@/postgres?host=%2Ftmp%2Fpg&port=5432"
    assert database_url(socket, "x") == "postgresql://postgres@/x?host=%2Ftmp%2Fpg&port=5432"
    assert database_url("postgresql://u@h:5432/test", "x") == "postgresql://u@h:5432/x"
    conninfo = database_url("host=/tmp/pg port=5433 dbname=postgres", "x").split()
    assert sorted(conninfo) == ["dbname=x", "host=/tmp/pg", "port=5433"]
