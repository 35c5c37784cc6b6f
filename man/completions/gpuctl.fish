# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_gpuctl_global_optspecs
    string join \n color= h/help V/version
end

function __fish_gpuctl_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_gpuctl_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_gpuctl_using_subcommand
    set -l cmd (__fish_gpuctl_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c gpuctl -n "__fish_gpuctl_needs_command" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_needs_command" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "info" -d 'Show every GPU and every process holding memory on it (the default command)'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "kill" -d 'Terminate GPU processes by selector, safely'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "clear" -d 'Reclaim GPU memory that crashed runs left behind; with --wait, until it is free'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "reset" -d 'Restore what a finished job may have changed on a card, as Slurm epilogs do'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "health" -d 'Tell a broken GPU from a busy one: one health verdict per GPU, with its causes'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "fleet" -d 'The whole fleet\'s GPU memory, waste and health, from the Prometheus that scrapes it'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "fraction" -d 'Show or set the per-process memory-share policy: the share of one GPU\'s memory a single process may hold'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "enable" -d 'Print or apply memory-efficient allocator settings for PyTorch, JAX and TensorFlow'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "top" -d 'The interactive view: every GPU and every process, refreshed, with gpuctl\'s safe kill'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "slurm" -d 'Slurm\'s prolog, epilog and node health check for GPU nodes'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "serve" -d 'Answer containers\' "which GPU processes are mine" on a Unix socket (host service)'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "run" -d 'Lease free, healthy GPUs, run a command on them, and leave nothing behind'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "pick" -d 'Print free, healthy GPUs for scripts that launch by other means; takes no lease'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l gpu -d 'Only this GPU: its index, UUID (or a unique prefix of one) or PCI bus id; or only this MIG instance: its MIG-... UUID, or GPU/GI as nvidia-smi -L shows them (0/9). Repeat for several. Default: every GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l watch -d 'Refresh every SECONDS (fractions allowed) until interrupted; with --json, one document per line at each refresh' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l timeout -d 'How long NVML may take to answer for one GPU (default: GPUCTL_NVML_TIMEOUT, else the configuration\'s nvml_timeout, else 10s). A GPU that has not answered by then is shown as not answering (exit status 1) and the others as read; info never waits longer than this and a second' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l by -d 'Totals instead of the per-GPU view: one row per user, per owner (Slurm job, systemd unit, container, Kubernetes pod), or per Kubernetes namespace, with the memory and the GPUs it holds. With --json, the document gains a `totals` list' -r -f -a "user\t''
owner\t''
namespace\t'The Kubernetes namespace of each pod, as the node\'s container runtime names it'"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l holders -d 'Look for the processes holding each GPU\'s device file (/dev/nvidiaN) that NVML does not list on it, and say what each is suspected to be. The scan reads every process\'s open files, so it runs only when asked: without it, the table says where a GPU has at least `holders_threshold` (default 1 GiB) of memory no listed process accounts for and no one looked. With --json, each device then carries `holders`'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l idle -d 'Only the processes the watchdog finds idle (memory held with SM under `[idle] util_below` for `[idle] after`), longest idle first: how long, since when, the memory, how much of the window was measured. Read from the watchdog\'s findings, so it works as soon as gpuctl starts. With --json, the document\'s processes are those'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l gpu -d 'Only this GPU: its index, UUID (or a unique prefix of one) or PCI bus id; or only this MIG instance: its MIG-... UUID, or GPU/GI as nvidia-smi -L shows them (0/9). Repeat for several. Default: every GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l pid -d 'This process. Repeat for several. A pid that is not using a GPU is refused' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l user -d 'Processes of this user (name or uid). Repeat for several' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l owner -d 'Processes of this owner, from their cgroup: slurm:JOBID, pod:UID, container:ID, unit:NAME (a system unit), unit:NAME@UID (a unit of user UID\'s own manager) or scope:NAME (ids by a prefix of at least 8 characters); pods also by the names the node\'s container runtime gives them, pod:NAMESPACE/NAME and namespace:NAMESPACE (globs: pod:ml/trainer-*). Repeat for several. slurm:JOBID is the job as Slurm\'s cgroups name it; processes that only their environment ties to the job (proctrack/linuxproc, shown "(env)") are matched by slurm:JOBID@UID alone, the job as user UID\'s processes claim it: any user can set SLURM_JOB_ID. The Slurm epilog ends a finished job\'s leftovers of the job\'s own user only' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l min-mem -d 'Processes holding at least SIZE of GPU memory in all (512MiB, 40GiB, 1.5GB)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l older-than -d 'Processes running for at least DURATION (90s, 2h, 3d)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l signal -d 'The first signal, by name or number (TERM, INT, HUP, KILL, 15, ...)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l timeout -d 'How long to wait for the process to exit after the first signal before SIGKILL, and for NVML to show its memory released (10s, 500ms, 2m)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l stale -d 'Leftovers of crashed runs, as `gpuctl clear` finds them'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l all -d 'Every GPU process the other selectors allow. Needs --yes, or a confirmation on a terminal'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -s y -l yes -d 'Do not ask before signalling several users\' processes, or with --all'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l force -d 'End a CUDA MPS server or control daemon that --pid names, and with it every client it serves. Without it they are never signalled; their skip names the clients'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l dry-run -d 'Say what would be done and why, and do it not: nothing is signalled, reset or resumed'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand kill" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l gpu -d 'Only this GPU: its index, UUID (or a unique prefix of one) or PCI bus id; or only this MIG instance: its MIG-... UUID, or GPU/GI as nvidia-smi -L shows them (0/9). Repeat for several. Default: every GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l wait -d 'Then wait until the selected GPUs (or MIG instances: their own memory) are free (see --min-free), for at most TIMEOUT: `--wait 2m` or `--wait=2m`; a bare --wait (followed by an option or nothing) waits 60s. Not free by then: exit status 4' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l min-free -d 'What --wait waits for: at least this much free memory on each selected GPU, as a size (130GiB) or a percentage of its memory (90%). Default: no process left on the GPU and under 256 MiB in use' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l signal -d 'The first signal, by name or number (TERM, INT, HUP, KILL, 15, ...)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l timeout -d 'How long to wait for the process to exit after the first signal before SIGKILL, and for NVML to show its memory released (10s, 500ms, 2m)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l include-stopped -d 'Also reclaim stopped processes (state T)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l holders -d 'Also end the processes holding a GPU\'s device file (/dev/nvidiaN) that NVML does not list on it and that no live job claims: a zombie or exiting process, one in a container\'s PID namespace, one nothing places (see `gpuctl info --holders`). Never a protected program, a process NVML lists on another GPU, or a process of a job NVML lists alive'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l dry-run -d 'Say what would be done and why, and do it not: nothing is signalled, reset or resumed'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand clear" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l gpu -d 'Only this GPU: its index, UUID (or a unique prefix of one) or PCI bus id; or only this MIG instance: its MIG-... UUID, or GPU/GI as nvidia-smi -L shows them (0/9). Repeat for several. Default: every GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l application-clocks -d 'Application clocks back to their default'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l locked-clocks -d 'Release locked GPU clocks'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l memory-locked-clocks -d 'Release locked memory clocks'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l compute-mode -d 'Compute mode back to DEFAULT'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l accounting -d 'Clear accounting\'s records of finished processes'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l peaks -d 'Clear gpuctl\'s peak memory marks'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l gpu-reset -d 'Reset the GPUs named with --gpu themselves (what a pending row remap, a page retirement or an Xid\'s gpu_reset needs), and nothing else: refused, naming every holder, while any process uses the GPU (listed by NVML, or holding its device file). With none, done through NVML where the driver offers it (drain, remove, rediscover), else with nvidia-smi --gpu-reset. The GPU\'s Xids up to then are acknowledged'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l dry-run -d 'Say what would be done and why, and do it not: nothing is signalled, reset or resumed'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand reset" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand health" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand health" -l gpu -d 'Only this GPU: its index, UUID (or a unique prefix of one) or PCI bus id; or only this MIG instance: its MIG-... UUID, or GPU/GI as nvidia-smi -L shows them (0/9). Repeat for several. Default: every GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand health" -l ack -d 'Acknowledge this GPU\'s Xids up to now (index, UUID or PCI bus id; repeat for several): on a driver without the recovery-action field they then hold no action, and stay listed as history. Written to the watchdog\'s state directory (root\'s)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand health" -l timeout -d 'How long NVML may take to answer for one GPU (default: GPUCTL_NVML_TIMEOUT, else the configuration\'s nvml_timeout, else 10s). A GPU that has not answered by then is listed without a verdict (exit status 1, unless another GPU needs an action)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand health" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand health" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l prometheus -d 'The query API\'s base URL: Prometheus, Thanos, Mimir or VictoriaMetrics (default: the configuration\'s [fleet] prometheus)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l bearer-token-file -d 'A file holding the bearer token sent with each query (default: [fleet] bearer_token_file)' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l ca-file -d 'PEM certificates of the CAs that sign the server\'s certificate, in place of the built-in public roots (default: [fleet] ca_file)' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l node -d 'Only the nodes whose name matches PATTERN (a regular expression, matched whole, as Prometheus matches labels: \'gpu-0[1-4]\', \'dgx.*\')' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l by -d 'Totals across the fleet per user or per owner: memory held now, held idle now, and GiB-hours held and held idle over --since' -r -f -a "user\t''
owner\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l since -d 'The window of --by\'s GiB-hours' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l stale-after -d 'How old a node\'s metrics may be before it counts as not reporting (default: three of its watchdog\'s intervals, at least 60s)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l timeout -d 'How long a query may take' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l watch -d 'Redraw every SECONDS (default 5) until interrupted' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l concurrency -d 'With --exec: how many nodes at once (default: [fleet] concurrency, else 8)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l detail -d 'Run `gpuctl info` on NODE through the [fleet] exec template and show its table' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l plan -d 'Print, per node, the commands that would reclaim or fix what it found'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l exec -d 'Carry the plan out through the configured [fleet] exec template, after showing it and asking (or with --yes)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l yes -d 'With --exec: do not ask'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fleet" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fraction" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fraction" -l gpu -d 'A per-GPU entry (index or UUID); when showing, only this GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fraction" -l user -d 'A per-user entry; when showing, the share this user\'s processes get' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fraction" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand fraction" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand enable" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand enable" -l shell -d 'Print the settings for this shell' -r -f -a "sh\t''
bash\t''
zsh\t''
fish\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand enable" -l gpu -d 'The GPUs for --persistence and for the share policy (index, UUID or bus id). Repeat for several. Default: every GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand enable" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand enable" -l persistence -d 'Also turn persistence mode on for the selected GPUs (root): the driver stays loaded between jobs, so the next one starts without the initialisation delay'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand enable" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l gpu -d 'Only this GPU: its index, UUID (or a unique prefix of one) or PCI bus id; or only this MIG instance: its MIG-... UUID, or GPU/GI as nvidia-smi -L shows them (0/9). Repeat for several. Default: every GPU' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l interval -d 'Refresh every SECONDS (fractions allowed, at least 0.1)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog healthcheck account help" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog healthcheck account help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog healthcheck account help" -f -a "prolog" -d 'Before a job: reclaim crashed runs\' leftovers on the job\'s GPUs only, and wait until they are free; if they are not, drain the node with the reason and exit 1 (Slurm then requeues the job)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog healthcheck account help" -f -a "epilog" -d 'After a job: end what is left of it (by its cgroup, or by SLURM_JOB_ID in the environment of processes no cgroup ties to a job), check its GPUs\' memory is released, restore the card settings it may have changed, and write its account. On failure, drain the node with the reason and exit 1'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog healthcheck account help" -f -a "healthcheck" -d 'Slurm\'s HealthCheckProgram: drain this node when a GPU\'s health verdict needs a reset, a reboot or a drain (the reason names the GPU, the action and the causes); resume it if gpuctl drained it and the GPUs are healthy, and the GPUs a memory reason named free, now. A node drained for any other reason is left alone'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog healthcheck account help" -f -a "account" -d 'The per-job accounts the epilog wrote (slurm-jobs.jsonl in the watchdog\'s state directory), oldest first: GPUs, peak memory, mean SM, and the time and GiB-hours held idle as the watchdog measured them. Exit status 1 when --job names a job with no account'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog healthcheck account help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from prolog" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from prolog" -l wait -d 'How long to wait for the job\'s GPUs to be free' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from prolog" -l no-drain -d 'Exit 1 on failure without draining the node (Slurm then drains it with its own reason, "Prolog error")'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from prolog" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from epilog" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from epilog" -l timeout -d 'How long a leftover gets after SIGTERM before SIGKILL, and how long its memory may take to be released' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from epilog" -l no-drain -d 'Exit 1 on failure without draining the node (Slurm then drains it with its own reason, "Epilog error")'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from epilog" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from healthcheck" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from healthcheck" -l node -d 'The node to check (default: SLURMD_NODENAME, else the short host name)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from healthcheck" -l dry-run -d 'Say what would be done and why, and do it not: nothing is signalled, reset or resumed'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from healthcheck" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from account" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from account" -l job -d 'Only this job\'s account' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from account" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from account" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from help" -f -a "prolog" -d 'Before a job: reclaim crashed runs\' leftovers on the job\'s GPUs only, and wait until they are free; if they are not, drain the node with the reason and exit 1 (Slurm then requeues the job)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from help" -f -a "epilog" -d 'After a job: end what is left of it (by its cgroup, or by SLURM_JOB_ID in the environment of processes no cgroup ties to a job), check its GPUs\' memory is released, restore the card settings it may have changed, and write its account. On failure, drain the node with the reason and exit 1'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from help" -f -a "healthcheck" -d 'Slurm\'s HealthCheckProgram: drain this node when a GPU\'s health verdict needs a reset, a reboot or a drain (the reason names the GPU, the action and the causes); resume it if gpuctl drained it and the GPUs are healthy, and the GPUs a memory reason named free, now. A node drained for any other reason is left alone'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from help" -f -a "account" -d 'The per-job accounts the epilog wrote (slurm-jobs.jsonl in the watchdog\'s state directory), oldest first: GPUs, peak memory, mean SM, and the time and GiB-hours held idle as the watchdog measured them. Exit status 1 when --job names a job with no account'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand slurm; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand serve" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand serve" -l socket -d 'The Unix socket to listen on (default: GPUCTL_SOCKET, else /run/gpuctl/api.sock). Ignored when systemd passes a socket (LISTEN_FDS)' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand serve" -l idle-exit -d 'Exit after this long without a client (e.g. 60s): under socket activation systemd keeps the socket and starts the service again for the next client, so it holds no memory at rest. Default: serve until stopped' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l gpus -d 'How many GPUs to lease (default 1): any that qualify' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l gpu -d 'Lease exactly this GPU or MIG instance (index, UUID, bus id, or GPU/GI as nvidia-smi -L shows them); repeat for several. All of them must qualify' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l min-free -d 'Qualify GPUs with at least this much free memory, as a size (40GiB) or a percentage of the GPU\'s memory (50%), instead of "no process and under 256 MiB in use"' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l max-util -d 'Qualify GPUs whose utilization is under PCT percent (1-100); with --min-free too, both must hold' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l wait -d 'Wait up to DURATION (30s, 10m) for enough GPUs to qualify and be free of leases, saying who holds what it waits for. Not enough by then: exit status 4' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l name -d 'Name the run: a crashed earlier run of this name (its run file left behind) has its leftovers ended first, and a live run of this name is refused' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l json-summary -d 'Also write the summary as one JSON document to FILE (docs/json.md)' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l no-enable -d 'Do not add `gpuctl enable`\'s allocator settings to the command\'s environment'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -s q -l quiet -d 'No summary and no waiting notes on stderr (errors, and leftovers that could not be ended, are still said)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand pick" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand pick" -l min-free -d 'Qualify GPUs with at least this much free memory, as a size (40GiB) or a percentage of the GPU\'s memory (50%), instead of "no process and under 256 MiB in use"' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand pick" -l max-util -d 'Qualify GPUs whose utilization is under PCT percent (1-100); with --min-free too, both must hold' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand pick" -l index -d 'Print each GPU\'s index (0, or 0/3 for a MIG instance) instead of its UUID'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand pick" -l json -d 'Print one JSON document (its version in the `schema` field; see docs/json.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand pick" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "info" -d 'Show every GPU and every process holding memory on it (the default command)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "kill" -d 'Terminate GPU processes by selector, safely'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "clear" -d 'Reclaim GPU memory that crashed runs left behind; with --wait, until it is free'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "reset" -d 'Restore what a finished job may have changed on a card, as Slurm epilogs do'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "health" -d 'Tell a broken GPU from a busy one: one health verdict per GPU, with its causes'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "fleet" -d 'The whole fleet\'s GPU memory, waste and health, from the Prometheus that scrapes it'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "fraction" -d 'Show or set the per-process memory-share policy: the share of one GPU\'s memory a single process may hold'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "enable" -d 'Print or apply memory-efficient allocator settings for PyTorch, JAX and TensorFlow'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "top" -d 'The interactive view: every GPU and every process, refreshed, with gpuctl\'s safe kill'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "slurm" -d 'Slurm\'s prolog, epilog and node health check for GPU nodes'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "serve" -d 'Answer containers\' "which GPU processes are mine" on a Unix socket (host service)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "run" -d 'Lease free, healthy GPUs, run a command on them, and leave nothing behind'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "pick" -d 'Print free, healthy GPUs for scripts that launch by other means; takes no lease'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info kill clear reset health fleet fraction enable top slurm serve run pick help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from slurm" -f -a "prolog" -d 'Before a job: reclaim crashed runs\' leftovers on the job\'s GPUs only, and wait until they are free; if they are not, drain the node with the reason and exit 1 (Slurm then requeues the job)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from slurm" -f -a "epilog" -d 'After a job: end what is left of it (by its cgroup, or by SLURM_JOB_ID in the environment of processes no cgroup ties to a job), check its GPUs\' memory is released, restore the card settings it may have changed, and write its account. On failure, drain the node with the reason and exit 1'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from slurm" -f -a "healthcheck" -d 'Slurm\'s HealthCheckProgram: drain this node when a GPU\'s health verdict needs a reset, a reboot or a drain (the reason names the GPU, the action and the causes); resume it if gpuctl drained it and the GPUs are healthy, and the GPUs a memory reason named free, now. A node drained for any other reason is left alone'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from slurm" -f -a "account" -d 'The per-job accounts the epilog wrote (slurm-jobs.jsonl in the watchdog\'s state directory), oldest first: GPUs, peak memory, mean SM, and the time and GiB-hours held idle as the watchdog measured them. Exit status 1 when --job names a job with no account'
