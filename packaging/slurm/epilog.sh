#!/bin/sh
# Slurm Epilog for GPU nodes (slurm.conf: Epilog=/usr/share/gpuctl/slurm/epilog.sh).
#
# After a job ends, end whatever of it is still on a GPU (found by its cgroup: the job's,
# under Slurm's cgroup plugin, v1 or v2), then restore the card settings it may have
# changed on its GPUs (clocks, compute mode, accounting; gpuctl never resets the GPU). A
# non-zero exit (a leftover that would not die, a setting that could not be restored)
# drains the node for an admin to look at.
#
# Settings (environment of slurmd): GPUCTL (the gpuctl binary), GPUCTL_EPILOG_TIMEOUT (how
# long a leftover gets after SIGTERM before SIGKILL, default 10s).
set -u
gpuctl=${GPUCTL:-gpuctl}
timeout=${GPUCTL_EPILOG_TIMEOUT:-10s}

if [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "gpuctl epilog: SLURM_JOB_ID is not set; is this running as a Slurm epilog?" >&2
    exit 1
fi

# Nothing left is exit 0; a leftover that survived, or could not be signalled, is 1.
"$gpuctl" kill --owner "slurm:$SLURM_JOB_ID" --yes --timeout "$timeout" --color never
killed=$?

status=$killed
gpus=${SLURM_JOB_GPUS:-}
if [ -n "$gpus" ]; then
    set --
    old_ifs=$IFS
    IFS=,
    for gpu in $gpus; do
        set -- "$@" --gpu "$gpu"
    done
    IFS=$old_ifs
    "$gpuctl" reset "$@" --color never || status=1
fi
exit "$status"
