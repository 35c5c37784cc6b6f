#!/bin/sh
# Slurm Epilog for GPU nodes (slurm.conf: Epilog=/usr/share/gpuctl/slurm/epilog.sh).
#
# After a job ends: end whatever of it is still on a GPU (by its cgroup under
# proctrack/cgroup; by SLURM_JOB_ID in the environment of processes no cgroup ties to a job,
# as proctrack/linuxproc leaves them), check that its GPUs' memory is released, and restore
# the card settings it may have changed (gpuctl never resets the GPU itself). Then it writes
# the job's account (peak GPU memory, leftovers ended, memory reclaimed) to
# /var/lib/gpuctl/slurm-jobs.jsonl. A leftover that would not die, or memory still held,
# drains the node with a reason that names them, and exits 1. See `gpuctl slurm epilog
# --help`.
#
# Settings, as for prolog.sh, from /etc/default/gpuctl: GPUCTL, GPUCTL_EPILOG_TIMEOUT (how
# long a leftover gets after SIGTERM before SIGKILL, and its memory to be released; default
# 10s).
set -u
PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
defaults=${GPUCTL_DEFAULTS:-/etc/default/gpuctl}
if [ -r "$defaults" ]; then
    set -a
    . "$defaults"
    set +a
fi
exec "${GPUCTL:-gpuctl}" slurm epilog --timeout "${GPUCTL_EPILOG_TIMEOUT:-10s}"
