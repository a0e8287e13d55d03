#!/usr/bin/env bash
# SB3 PPO on WatchRepair-v0 with and without a credit rule: plain PPO (SB3's GAE), broadcast (G - V(s_0) on every
# step) and vcbm_bookmark (the return's advantage concentrated on the bookmarked first decision), same seeds.
#   benchmarks/sb3_credit.sh [OUT_DIR] [SEEDS] [MAX_EPISODES] [WORKERS]
# Finished seeds in OUT_DIR are reused, so an interrupted run resumes where it stopped. The outputs (not the runs)
# are copied to benchmarks/results/sb3_credit/ (benchmarks/make_results.py turns them into benchmarks/RESULTS.md).
set -euo pipefail
out="${1:-runs/sb3_credit}"
seeds="${2:-3}"
max_episodes="${3:-10000}"
workers="${4:-2}"
cd "$(dirname "$0")/.."
nice -n 10 python -m algorithms.compare --env WatchRepair-v0 --algos ppo ppo+broadcast ppo+vcbm_bookmark \
    --seeds "$seeds" --max-episodes "$max_episodes" --workers "$workers" --out "$out"
mkdir -p benchmarks/results/sb3_credit
cp "$out"/{results.json,run.json,table.md,figure.png,curves.png} benchmarks/results/sb3_credit/
