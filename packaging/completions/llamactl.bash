# bash completion for llamactl.
# Fallback installed when the binary cannot generate its own (`llamactl completions bash`):
# subcommands and options are read from `llamactl [SUBCOMMAND...] --help` at completion time.
_llamactl() {
    local cur=${COMP_WORDS[COMP_CWORD]} help words i
    local -a sub=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        [[ ${COMP_WORDS[i]} == -* ]] || sub+=("${COMP_WORDS[i]}")
    done
    help=$(llamactl "${sub[@]}" --help 2>/dev/null) || return 0
    if [[ $cur == -* ]]; then
        words=$(sed -n -e 's/^ *-[A-Za-z], \(--[A-Za-z0-9-]*\).*/\1/p' -e t -e 's/^ *\(--[A-Za-z0-9-]*\).*/\1/p' <<<"$help")
    else
        words=$(awk '/^Commands:/ { f = 1; next } /^[^ ]/ || /^$/ { f = 0 } f && $1 != "help" { print $1 }' <<<"$help")
    fi
    mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
}
complete -F _llamactl llamactl
