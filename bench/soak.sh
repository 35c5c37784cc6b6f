#!/usr/bin/env bash
# Reliability soaks of gpuctl-watchdog against nvml-sim, SECONDS (default 600) each, one
# after the other (each wants the machine to itself):
# - faults: NVML errors (2% of calls) and a GPU hanging now and then, while healthy runs
#   start and stop and runs crash; fails on any healthy process killed, a crash left past
#   its bound, the daemon dying or RSS growth.
# - attack (needs root): the same daemon among a user's runs while another user attacks:
#   a protected program with her library preloaded, a Slurm job's owner forged (cgroup
#   under her user@ service, SLURM_JOB_ID), pids reused (a fork loop, reclaimed pids given
#   anew), with [idle] action = "reclaim" and exempt_owners on, a third user's idle process
#   claiming the exempt jobs through SLURM_JOB_ID; fails on any victim ended (alice's
#   exempt idle process included), attacker spared, forgery accepted, daemon restart or
#   RSS growth.
# Prints each soak's `soak:` line. The suite runs the same tests for 30 s and 20 s
# (tests/watchdog.rs).
# Usage: bench/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
cargo build --quiet -p gpuctl -p gpuctl-watchdog -p nvml-sim -p gpuctl-e2e
status=0
for soak in a_soak_under_injected_faults a_soak_under_attack; do
    # Both run even if the first fails; the findings (`round N: ...`) come with a failure.
    GPUCTL_SOAK_SECONDS="$seconds" cargo test --quiet -p gpuctl-e2e --test e2e "$soak" \
        -- --nocapture 2>&1 | grep -E '^soak:|test result|panicked|^round [0-9]+:' || status=1
done
exit "$status"
