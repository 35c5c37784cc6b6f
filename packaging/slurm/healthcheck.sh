#!/bin/sh
# Slurm HealthCheckProgram for GPU nodes (slurm.conf: HealthCheckProgram=
# /usr/share/gpuctl/slurm/healthcheck.sh, HealthCheckInterval=60 or so).
#
# Resumes this node when gpuctl's prolog or epilog drained it (its reason starts with
# "gpuctl:") and the GPUs that reason names are free now. A node drained for any other
# reason (an admin's, Slurm's own "Epilog error") is never resumed. What it does is logged
# to /var/lib/gpuctl/slurm.log. See `gpuctl slurm healthcheck --help`.
#
# Settings, as for prolog.sh, from /etc/default/gpuctl: GPUCTL.
set -u
PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
defaults=${GPUCTL_DEFAULTS:-/etc/default/gpuctl}
if [ -r "$defaults" ]; then
    set -a
    . "$defaults"
    set +a
fi
exec "${GPUCTL:-gpuctl}" slurm healthcheck
