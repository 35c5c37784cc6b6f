#!/bin/sh
# A site epilog of the common kind, which parses nvidia-smi: the node is not handed to the
# next job while any GPU process is left. Rehearse it on a simulated server:
#   nvml-sim run crates/nvml-sim/examples/h200x8.toml -- sh crates/nvml-sim/examples/epilog-nvidia-smi.sh
left=$(nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv,noheader) || {
    echo "epilog: nvidia-smi failed" >&2
    exit 1
}
if [ -n "$left" ]; then
    echo "epilog: $(echo "$left" | wc -l) GPU processes left:" >&2
    echo "$left" >&2
    exit 1
fi
echo "epilog: GPUs free"
