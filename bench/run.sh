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
