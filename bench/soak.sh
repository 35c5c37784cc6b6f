#!/usr/bin/env bash
# Reliability soak: gpuctl-watchdog for SECONDS (default 600) against nvml-sim injecting
# NVML errors (2% of calls) and hanging a GPU now and then, while healthy runs start and
# stop and runs crash. Prints rounds, crashes reclaimed and the daemon's RSS; fails on any
# healthy process killed, a crash left past its bound, the daemon dying or RSS growth.
# The suite runs the same test for 30 s (tests/watchdog.rs).
# Usage: bench/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet -p gpuctl-watchdog -p nvml-sim -p gpuctl-e2e
GPUCTL_SOAK_SECONDS="${1:-600}" cargo test --quiet -p gpuctl-e2e --test e2e \
    a_soak_under_injected_faults -- --nocapture 2>&1 | grep -E '^soak:|test result|panicked'
