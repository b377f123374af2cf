#!/usr/bin/env bash
# Runs the llamad package under a real systemd: boots a Debian container (bookworm, or trixie with SUITE=trixie)
# (systemd-nspawn, host network) with the .deb installed and the unit enabled, then checks
# readiness (Type=notify), the RPC port, DynamicUser, the admin token credential, reload,
# the watchdog, journald's structured fields, the online `systemd-analyze security` figure and a
# clean stop.
#
# Usage: packaging/systemd-test.sh           (amd64 only; run as root; needs no systemd on the host)
# Environment: DEB_DIR (default ${CARGO_TARGET_DIR:-target}/debian), PORT (default 50153),
#   MIRROR (default http://deb.debian.org/debian), SUITE (default bookworm). The container image is
#   cached in ~/.cache/llamad-packaging/$SUITE-systemd-amd64.tar.gz (made from install-test.sh's one).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEB_DIR=${DEB_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/debian}
PORT=${PORT:-50153}
SUITE=${SUITE:-bookworm}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/llamad-packaging
BASE=$CACHE/$SUITE-minbase-amd64.tar.gz
IMAGE=$CACHE/$SUITE-systemd-amd64.tar.gz

log() { printf '\n== %s\n' "$*"; }
FAILED=()
check() { # check NAME COMMAND...: record the outcome of a check
    local name=$1
    shift
    if "$@"; then
        echo "PASS $name"
    else
        echo "FAIL $name"
        FAILED+=("$name")
    fi
}

deb=$(ls "$DEB_DIR"/llamad_*_amd64.deb 2>/dev/null | tail -1)
[[ -n $deb ]] || { echo "no llamad amd64 .deb in $DEB_DIR (run packaging/build.sh amd64)" >&2; exit 1; }
command -v systemd-nspawn >/dev/null || apt-get install -y --no-install-recommends systemd-container
if [[ ! -s $IMAGE ]]; then
    [[ -s $BASE ]] || SUITE=$SUITE "$ROOT/packaging/install-test.sh" amd64 || true
    [[ -s $BASE ]] || { echo "no $BASE" >&2; exit 1; }
fi

TMP=$(mktemp -d /tmp/llamad-systemd-test.XXXXXX)
CH=$TMP/root
NSPAWN_PID=
cleanup() {
    set +e
    if [[ -n $NSPAWN_PID ]] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
        kill "$NSPAWN_PID"
        wait "$NSPAWN_PID"
    fi
    mountpoint -q "$CH/proc" && umount "$CH/proc"
    mountpoint -q "$CH/dev" && umount "$CH/dev"
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$CH"

if [[ -s $IMAGE ]]; then
    tar -C "$CH" -xzf "$IMAGE"
else
    log "building the container image ($SUITE minbase + systemd)"
    tar -C "$CH" -xzf "$BASE"
    mount -t proc proc "$CH/proc"
    mount --bind /dev "$CH/dev"
    cp /etc/resolv.conf "$CH/etc/resolv.conf"
    chroot "$CH" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive sh -c \
        'apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd systemd-sysv dbus && apt-get clean' \
        >"$TMP/apt.log" 2>&1 || { tail -20 "$TMP/apt.log"; exit 1; }
    umount "$CH/dev" "$CH/proc"
    tar -C "$CH" -czf "$IMAGE.part" . && mv "$IMAGE.part" "$IMAGE"
fi

log "install $(basename "$deb"), enable llamad.service, boot"
cp "$deb" "$CH/tmp/"
mount -t proc proc "$CH/proc"
mount --bind /dev "$CH/dev"
cp /etc/resolv.conf "$CH/etc/resolv.conf"
chroot "$CH" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -qq && apt-get install -y --no-install-recommends /tmp/$(basename "$deb")" \
    >"$TMP/apt-install.log" 2>&1 || { cat "$TMP/apt-install.log"; exit 1; }
umount "$CH/dev" "$CH/proc"
printf 'LLAMAD_ARGS="--port %s"\n' "$PORT" >"$CH/etc/default/llamad"
chroot "$CH" systemctl enable llamad.service
systemd-nspawn -D "$CH" --boot --register=no --keep-unit --quiet >"$TMP/console.log" 2>&1 &
NSPAWN_PID=$!
init=
# The container's PID 1: nspawn's child that is PID 1 in its own PID namespace.
for _ in $(seq 1 100); do
    for p in $(pgrep -P "$NSPAWN_PID" || true); do
        grep -qE '^NSpid:.*\s1$' "/proc/$p/status" && init=$p
    done
    [[ -n $init ]] && break
    sleep 0.2
done
[[ -n $init ]] || { cat "$TMP/console.log"; echo "container did not start" >&2; exit 1; }
in_ct() { nsenter -t "$init" -m -u -i -p -r -w -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
for _ in $(seq 1 150); do
    in_ct test -S /run/systemd/private && break
    sleep 0.2
done
state=$(in_ct timeout 90 systemctl is-system-running --wait 2>/dev/null) || true
echo "container: systemd $(in_ct systemctl --version | head -1 | awk '{print $2}'), system $state"

prop() { in_ct systemctl show llamad.service -P "$1"; }
hello() {
    python3 - "$PORT" <<'EOF'
import socket, struct, sys
# ref: ggml-rpc-protocol.md §6: HELLO request and its 28-byte reply.
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
buf = b""
while len(buf) < 36:
    chunk = s.recv(36 - len(buf))
    if not chunk:
        break
    buf += chunk
sys.exit(0 if len(buf) == 36 and struct.unpack("<Q", buf[:8])[0] == 28 and buf[8] == 7 else 1)
EOF
}

log "checks"
check "active after READY=1 (Type=notify)" test "$(prop ActiveState)/$(prop SubState)" = active/running
pid=$(prop MainPID)
echo "MainPID $pid, uid $(in_ct stat -c %u "/proc/$pid"), status: $(prop StatusText)"
check "RPC HELLO on port $PORT" hello
# Under systemd (JOURNAL_STREAM set) llamad logs through tracing-journald: the HELLO connection's
# "connection closed" entry carries its fields as journal fields (tracing-journald prefixes
# event fields with F_), not only as text in MESSAGE.
journal_fields() {
    local entry
    for _ in $(seq 1 20); do
        entry=$(in_ct journalctl -u llamad.service -o json --no-pager | grep '"MESSAGE":"connection closed"' | tail -1)
        [[ -n $entry ]] && break
        sleep 0.2
    done
    echo "journal entry: ${entry:0:400}"
    grep -qE '"F_PEER":"127\.0\.0\.1:[0-9]+"' <<<"$entry" && grep -qE '"F_BYTES_IN":"[0-9]+"' <<<"$entry" &&
        grep -qE '"F_COMMANDS":' <<<"$entry"
}
check "journald entry with structured fields (F_PEER, F_BYTES_IN, F_COMMANDS)" journal_fields
check "dynamic user (not root)" test "$(in_ct stat -c %U "/proc/$pid")" != root
check "cache directory /var/cache/private/llamad" in_ct test -d /var/cache/private/llamad
check "state directory /var/lib/private/llamad" in_ct test -d /var/lib/private/llamad
check "admin token credential" in_ct test -s /run/credentials/llamad.service/admin.token
check "LLAMA_CACHE=/var/cache/llamad" in_ct sh -c "tr '\\0' '\\n' </proc/$pid/environ | grep -qx LLAMA_CACHE=/var/cache/llamad"
log "systemd-analyze security llamad.service (online)"
in_ct systemd-analyze security --no-pager llamad.service | grep -E '^✗|Overall' || true
log "watchdog: waiting 40 s (WatchdogSec=30s)"
sleep 40
check "no watchdog timeout or restart" test "$(prop MainPID)/$(prop NRestarts)/$(prop ActiveState)" = "$pid/0/active"
log "reload (SIGHUP)"
pid=$(prop MainPID)
in_ct systemctl reload llamad.service || true
sleep 2
check "still running with the same PID after reload" test "$(prop MainPID)/$(prop ActiveState)" = "$pid/active"
log "stop"
in_ct systemctl stop llamad.service || true
check "stopped cleanly" test "$(prop ActiveState)/$(prop Result)" = inactive/success
log "journal of llamad.service"
in_ct journalctl -u llamad.service --no-pager | tail -25
in_ct systemctl poweroff || true
wait "$NSPAWN_PID" || true
NSPAWN_PID=

if [[ ${#FAILED[@]} -gt 0 ]]; then
    printf '\nsystemd-test: FAILED: %s\n' "${FAILED[*]}"
    exit 1
fi
printf '\nsystemd-test: PASSED\n'
