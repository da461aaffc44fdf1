#!/usr/bin/env bash
# Runs every benchmark recorded in docs/BENCHMARKS.md. Usage: bench/run.sh [HACO]
set -euo pipefail
cd "$(dirname "$0")/.."
haco=${1:-.venv/bin/haco}
mkdir -p out/bench
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
# The runtime, ingest and recompute benches start their own servers and workers; they
# use an embedded Redis unless HACO_REDIS_URL is set (see bench/README.md), and the
# machine's Postgres (--pg-url) for the trace store.
py="$(dirname "$haco")/python"
env -u HACO_REDIS_URL "$py" -m bench.runtime all --json out/bench/runtime.json > /dev/null
"$py" -m bench.ingest > out/bench/ingest.json
"$py" -m bench.ingest --harvesters 2 > out/bench/ingest2.json
"$py" -m bench.recompute > out/bench/recompute.json
env -u HACO_REDIS_URL "$py" -m bench.harvest_lag > out/bench/harvest-lag.json
env -u HACO_REDIS_URL "$py" -m bench.darkzone > out/bench/darkzone.json
# Import cost of this tree; the before/after table in docs/BENCHMARKS.md adds
# --before PATH (a worktree of 1af3c4e).
"$py" -m bench.imports --top 5 > out/bench/imports.json
