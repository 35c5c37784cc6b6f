#!/bin/sh
# Slurm Prolog for GPU nodes (slurm.conf: Prolog=/usr/share/gpuctl/slurm/prolog.sh).
#
# Before a job starts, reclaim what crashed runs left on the GPUs it was given and wait until
# they are free. A non-zero exit makes Slurm drain the node and requeue the job: the right
# outcome for a GPU that cannot be freed. Only the job's GPUs are touched; a job without
# GPUs passes straight through.
#
# Settings (environment of slurmd): GPUCTL (the gpuctl binary), GPUCTL_PROLOG_WAIT (how long
# to wait for the GPUs, default 120s).
set -u
gpuctl=${GPUCTL:-gpuctl}
wait_for=${GPUCTL_PROLOG_WAIT:-120s}

# SLURM_JOB_GPUS lists the job's GPU indices, comma-separated ("0,1").
gpus=${SLURM_JOB_GPUS:-}
[ -n "$gpus" ] || exit 0

set --
old_ifs=$IFS
IFS=,
for gpu in $gpus; do
    set -- "$@" --gpu "$gpu"
done
IFS=$old_ifs

exec "$gpuctl" clear "$@" --wait="$wait_for" --color never
