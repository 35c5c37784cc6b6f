"""The benchmarks run gpuctl as root: what it keeps (peak marks, pod names) goes to a
scratch state directory of the run (GPUCTL_STATE_DIR), removed at its end, never to the
machine's /var/lib/gpuctl. A GPUCTL_STATE_DIR already set is kept."""

import atexit
import os
import shutil
import tempfile


def scratch():
    if os.environ.get("GPUCTL_STATE_DIR"):
        return
    path = tempfile.mkdtemp(prefix="gpuctl-bench-state-")
    os.environ["GPUCTL_STATE_DIR"] = path
    atexit.register(shutil.rmtree, path, True)
