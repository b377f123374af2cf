# fish completion for llamactl.
# Fallback installed when the binary cannot generate its own (`llamactl completions fish`):
# subcommands and options are read from `llamactl [SUBCOMMAND...] --help` at completion time.
function __llamactl_candidates
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l sub
    for t in $tokens
        string match -q -- '-*' $t; or set -a sub $t
    end
    set -l help (llamactl $sub --help 2>/dev/null); or return
    if string match -q -- '-*' (commandline -ct)
        printf '%s\n' $help | sed -n -e 's/^ *-[A-Za-z], \(--[A-Za-z0-9-]*\).*/\1/p' -e t -e 's/^ *\(--[A-Za-z0-9-]*\).*/\1/p'
    else
        printf '%s\n' $help | awk '/^Commands:/ { f = 1; next } /^[^ ]/ || /^$/ { f = 0 } f && $1 != "help" { print $1 }'
    end
end
complete -c llamactl -f -a '(__llamactl_candidates)'
