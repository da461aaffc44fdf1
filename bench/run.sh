#!/usr/bin/env bash
# Runs every benchmark recorded in docs/BENCHMARKS.md. Usage: bench/run.sh [all|hotpath] [HACO]
#   all      (default) the paper benchmarks, then the runtime, ingest and the rest
#   hotpath  issue 12 only: the runtime against its floors, its growth curves, ingest
#            with 1 and 2 harvesters, and the report they give docs/BENCHMARKS.md
set -euo pipefail
cd "$(dirname "$0")/.."
mode=all
case "${1:-}" in
  all | hotpath) mode=$1; shift ;;
esac
haco=${1:-.venv/bin/haco}
py="$(dirname "$haco")/python"
mkdir -p out/bench

# Issue 12: each figure beside its floor and bare Celery, measured in the same run. The
# runtime benches start their own servers and workers; they use an embedded Redis unless
# HACO_REDIS_URL is set (see bench/README.md), ingest the machine's Redis and Postgres.
hotpath() {
  env -u HACO_REDIS_URL "$py" -m bench.runtime all --json out/bench/runtime.json > /dev/null
  env -u HACO_REDIS_URL "$py" -m bench.runtime growth planning \
    --json out/bench/growth.json > /dev/null
  env -u HACO_REDIS_URL "$py" -m bench.runtime all --celery-consumer \
    --json out/bench/runtime-celery.json > /dev/null
  "$py" -m bench.ingest --harvesters 1 > out/bench/ingest.json
  "$py" -m bench.ingest --harvesters 2 > out/bench/ingest2.json
  env -u HACO_REDIS_URL "$py" -m bench.leancall > out/bench/leancall.json
  env -u HACO_REDIS_URL "$py" -m bench.reportscript > out/bench/reportscript.json
  env -u HACO_REDIS_URL "$py" -m bench.redistime > out/bench/redistime.json
  # A call's member window taken apart (stamped worker): the calls less the backend alone.
  env -u HACO_REDIS_URL "$py" -m bench.memberstamps --json out/bench/memberstamps.json > /dev/null
  # The staggered tail's policy alone, offline (no services): its share of the tail goal.
  "$py" -m bench.tailpolicy > out/bench/tailpolicy.json
  "$py" -m bench.hotpath_report --runtime out/bench/runtime.json \
    --growth out/bench/growth.json --ingest out/bench/ingest.json \
    --ingest2 out/bench/ingest2.json --leancall out/bench/leancall.json \
    --reportscript out/bench/reportscript.json --celery out/bench/runtime-celery.json \
    --memberstamps out/bench/memberstamps.json \
    --ingest-command "python -m bench.ingest --harvesters 1" \
    --ingest2-command "python -m bench.ingest --harvesters 2" --doc docs/BENCHMARKS.md
}

if [ "$mode" = hotpath ]; then
  hotpath
  exit 0
fi

"$haco" bench decision > out/bench/decision.json
"$haco" bench paper --out out/bench/paper > out/bench/paper-figures.json
"$haco" bench paper --scenario network_degradation --scenario candidate_degradation \
  --methods haco,bestone,random --taus '' --half-life 100 \
  --out out/bench/halflife > out/bench/halflife-figures.json
"$haco" bench paper --scenario-file docs/examples/llmperf.toml --taus '' \
  --methods random,bestone,moa,haco,fixed-global,fixed-local > out/bench/llmperf-figures.json
# Issue 10: the certificate's calibration per scenario and rule, and the cost frontier.
"$haco" bench calibration --out out/bench/calibration > out/bench/calibration-figures.json
"$haco" bench frontier --out out/bench/frontier > out/bench/frontier-figures.json
hotpath
"$py" -m bench.recompute > out/bench/recompute.json
env -u HACO_REDIS_URL "$py" -m bench.harvest_lag > out/bench/harvest-lag.json
env -u HACO_REDIS_URL "$py" -m bench.darkzone > out/bench/darkzone.json
# Import cost of this tree; the before/after table in docs/BENCHMARKS.md adds
# --before PATH (a worktree of 1af3c4e).
"$py" -m bench.imports --top 5 > out/bench/imports.json
