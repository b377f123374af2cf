#!/usr/bin/env bash
# Checks systemd/llamad.service without a running systemd: `systemd-analyze verify` inside a
# temporary root (the unit's ExecStart/ExecReload binaries and man page must exist there) and
# `systemd-analyze security --offline=yes` (exposure score).
#
# Usage: packaging/check-unit.sh [LLAMAD_BINARY] [MAN_PAGE]
#   LLAMAD_BINARY  built llamad to place at /usr/bin/llamad in the temporary root
#                  (default: a two-line shell script, enough for verify, which only checks
#                  that the file is executable)
#   MAN_PAGE       llamad.8 to install in the temporary root so Documentation=man:llamad(8)
#                  is checked too (default: `LLAMAD_BINARY man`, else a minimal page)
# Environment: MAX_EXPOSURE (default 2.0): fail when the exposure is above it.
# Exit status: 0 when verify is clean and the exposure is at most MAX_EXPOSURE.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
UNIT="$ROOT/systemd/llamad.service"
BIN=${1:-}
MAN=${2:-}
MAX_EXPOSURE=${MAX_EXPOSURE:-2.0}

if ! command -v systemd-analyze >/dev/null || ! command -v man >/dev/null; then
    echo "check-unit: installing systemd and man-db" >&2
    for _ in $(seq 1 30); do
        apt-get install -y --no-install-recommends systemd man-db >/dev/null && break
        echo "check-unit: apt busy, retrying in 10 s" >&2
        sleep 10
    done
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The temporary root: the unit, the targets it pulls in (copied from the host), the binaries
# its Exec lines name, and the man page its Documentation= names.
mkdir -p "$tmp/etc/systemd/system" "$tmp/usr/bin" "$tmp/usr/lib/systemd" "$tmp/usr/share/man/man8"
cp -a /usr/lib/systemd/system "$tmp/usr/lib/systemd/"
cp "$UNIT" "$tmp/etc/systemd/system/llamad.service"
if [[ -n $BIN ]]; then
    install -m 0755 "$BIN" "$tmp/usr/bin/llamad"
else
    printf '#!/bin/sh\nexit 0\n' >"$tmp/usr/bin/llamad"
    chmod 0755 "$tmp/usr/bin/llamad"
fi
# ExecReload=/bin/kill: /bin is a symlink to /usr/bin on merged-/usr systems (Ubuntu 24.04).
install -m 0755 "$(type -P kill)" "$tmp/usr/bin/kill"
ln -s usr/bin "$tmp/bin"
if [[ -n $MAN ]]; then
    cp "$MAN" "$tmp/usr/share/man/man8/llamad.8"
elif [[ -n $BIN ]]; then
    "$BIN" man >"$tmp/usr/share/man/man8/llamad.8"
else
    printf '.TH llamad 8\n.SH NAME\nllamad \\- worker daemon\n' >"$tmp/usr/share/man/man8/llamad.8"
fi

echo "== systemd-analyze verify ($(systemd-analyze --version | head -1))"
verify_out=$(MANPATH="$tmp/usr/share/man" systemd-analyze verify --man=yes --root="$tmp" llamad.service 2>&1) &&
    verify_rc=0 || verify_rc=$?
if [[ -n $verify_out ]]; then
    echo "$verify_out"
fi
if [[ $verify_rc -eq 0 && -z $verify_out ]]; then
    echo "verify: clean"
else
    echo "verify: FAILED (exit $verify_rc)"
fi

echo "== systemd-analyze security --offline=yes"
sec_out=$(systemd-analyze security --offline=yes --root="$tmp" --no-pager llamad.service 2>&1) || true
# Only the findings that cost something, then the summary line.
echo "$sec_out" | grep -E '^✗' || true
summary=$(echo "$sec_out" | grep -E 'Overall exposure level' || true)
echo "$summary"
exposure=$(echo "$summary" | grep -oE '[0-9]+\.[0-9]+' | head -1)
if [[ -z $exposure ]]; then
    echo "security: no exposure figure in the output:" >&2
    echo "$sec_out" >&2
    exit 1
fi
echo "exposure: $exposure (limit $MAX_EXPOSURE)"

status=0
[[ $verify_rc -eq 0 && -z $verify_out ]] || status=1
awk -v e="$exposure" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }' || {
    echo "security: exposure $exposure is above $MAX_EXPOSURE"
    status=1
}
exit $status
