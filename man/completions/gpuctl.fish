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
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l gpu -d 'Only this GPU: an index, a UUID (or a unique prefix of one) or a PCI bus id. Repeat for several' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l watch -d 'Refresh every SECONDS (fractions allowed) until interrupted' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l color -d 'When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -l json -d 'Print one JSON document (schema version in its `schema` field; see docs/json.md). With --watch, one document per line at each refresh'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand info" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info help" -f -a "info" -d 'Show every GPU and every process holding memory on it (the default command)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from info help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
