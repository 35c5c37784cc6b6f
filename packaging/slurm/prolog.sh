#!/bin/sh
# Slurm Prolog for GPU nodes (slurm.conf: Prolog=/usr/share/gpuctl/slurm/prolog.sh).
#
# Before a job starts, reclaim what crashed runs left on the GPUs it was given (only those)
# and wait until they are free. If they are not, the node is drained with a reason naming
# the GPU, the memory held and the process to blame ("gpuctl: GPU 1 (GPU-…): 6.0 GiB held,
# pid 4242 (alice, python3)"), and the exit status 1 makes Slurm requeue the job. A job
# without GPUs passes straight through. See `gpuctl slurm prolog --help`.
#
# slurmd runs it with a bare environment (no PATH, none of slurmd's own variables), so
# settings come from /etc/default/gpuctl when it exists (another file: GPUCTL_DEFAULTS):
# GPUCTL (the gpuctl binary), GPUCTL_PROLOG_WAIT (how long to wait for the GPUs, default
# 120s), and anything gpuctl reads (GPUCTL_CONFIG, GPUCTL_NVML_LIB).
set -u
PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
defaults=${GPUCTL_DEFAULTS:-/etc/default/gpuctl}
if [ -r "$defaults" ]; then
    set -a
    . "$defaults"
    set +a
fi
exec "${GPUCTL:-gpuctl}" slurm prolog --wait "${GPUCTL_PROLOG_WAIT:-120s}"
