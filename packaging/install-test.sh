#!/usr/bin/env bash
# Install test of the llamad and llamactl packages in a Debian minbase chroot: bookworm
# (glibc 2.36, systemd 252: older than every target) or trixie (glibc 2.41, systemd 257: newer
# than Ubuntu 24.04's 2.39 and 255), so the two runs bracket Ubuntu 24.04, whose own archive is
# not reachable from this build machine.
#
# Usage: packaging/install-test.sh [amd64|arm64]       (default: amd64; run as root)
#
# Steps: bootstrap (cached as a tarball in ~/.cache/llamad-packaging), record the file list,
# `apt-get install` both .debs, check the installed files and the admin token,
# `llamad check-config`, start `llamad serve` in the chroot (it shares the host's network),
# check that it answers: `llamactl status` through the admin API and a raw RPC HELLO,
# stop it with SIGTERM, create the directories systemd would create for DynamicUser=yes,
# `apt-get purge` both packages and compare the file list with the one before installation.
# For arm64 the qemu-aarch64 binfmt handler is registered for the test and removed afterwards
# (only if this script registered it).
#
# Environment:
#   DEB_DIR  where the .debs are (default: ${CARGO_TARGET_DIR:-target}/debian)
#   MIRROR   Debian mirror (default: http://deb.debian.org/debian)
#   PORT     RPC port for the test server (default: 50152; the admin API gets PORT+1)
#   SUITE    Debian suite of the chroot: bookworm (default) or trixie
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ARCH=${1:-amd64}
DEB_DIR=${DEB_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/debian}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PORT=${PORT:-50152}
ADMIN_PORT=$((PORT + 1))
SUITE=${SUITE:-bookworm}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/llamad-packaging
TARBALL=$CACHE/$SUITE-minbase-$ARCH.tar.gz

case $ARCH in
    amd64 | arm64) ;;
    *)
        echo "usage: $0 [amd64|arm64]" >&2
        exit 2
        ;;
esac

log() { printf '\n== %s\n' "$*"; }
fail() {
    echo "install-test: FAILED: $*" >&2
    exit 1
}

apt_install() {
    local missing=() p i
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    for i in $(seq 1 60); do
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" && return 0
        [[ $i -eq 1 ]] && { apt-get update || true; }
        echo "apt-get failed (lock held by another install?); retrying in 10 s" >&2
        sleep 10
    done
    return 1
}

shopt -s nullglob
debs=("$DEB_DIR"/llamad_*_"$ARCH".deb "$DEB_DIR"/llamactl_*_"$ARCH".deb)
shopt -u nullglob
[[ ${#debs[@]} -eq 2 ]] || fail "expected one llamad and one llamactl .deb for $ARCH in $DEB_DIR (run packaging/build.sh $ARCH)"

apt_install debootstrap python3 openssl
[[ $ARCH == arm64 ]] && apt_install qemu-user-static systemd

TMP=$(mktemp -d /tmp/llamad-install-test.XXXXXX)
CH=$TMP/root
SERVER_PID=
SOFT_FAILED=()
BINFMT_MOUNTED=0
BINFMT_REGISTERED=0
MOUNTS=()

cleanup() {
    set +e
    if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID"
        wait "$SERVER_PID" 2>/dev/null
    fi
    local i
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTS[i]}"
    done
    if [[ $BINFMT_REGISTERED -eq 1 ]]; then
        echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64
        echo "binfmt: qemu-aarch64 handler removed"
    fi
    if [[ $BINFMT_MOUNTED -eq 1 ]]; then
        umount /proc/sys/fs/binfmt_misc && echo "binfmt: binfmt_misc unmounted"
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

# Trap 4 of the cross notes: an arm64 chroot needs the binfmt handler.
if [[ $ARCH == arm64 ]]; then
    if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        BINFMT_MOUNTED=1
    fi
    if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
        /usr/lib/systemd/systemd-binfmt /usr/lib/binfmt.d/qemu-aarch64.conf
        BINFMT_REGISTERED=1
        echo "binfmt: qemu-aarch64 handler registered"
    fi
fi

mkdir -p "$CH" "$CACHE"
if [[ -s $TARBALL ]]; then
    log "unpacking cached $TARBALL"
else
    log "debootstrap --arch=$ARCH --variant=minbase $SUITE ($MIRROR)"
    started=$SECONDS
    debootstrap --arch="$ARCH" --variant=minbase "$SUITE" "$TMP/boot" "$MIRROR" >"$TMP/debootstrap.log" 2>&1 ||
        { tail -20 "$TMP/debootstrap.log"; fail "debootstrap"; }
    chroot "$TMP/boot" apt-get clean
    tar -C "$TMP/boot" -czf "$TARBALL.part" . && mv "$TARBALL.part" "$TARBALL"
    rm -rf "$TMP/boot"
    echo "bootstrapped in $((SECONDS - started)) s, cached as $TARBALL"
fi
tar -C "$CH" -xzf "$TARBALL"

for m in proc dev; do
    case $m in
        proc) mount -t proc proc "$CH/proc" ;;
        dev) mount --bind /dev "$CH/dev" ;;
    esac
    MOUNTS+=("$CH/$m")
done
CHROOT_ENV=(/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
in_chroot() { chroot "$CH" "${CHROOT_ENV[@]}" "$@"; }

echo "chroot: $(in_chroot sh -c '. /etc/os-release; echo "$PRETTY_NAME"'), $(in_chroot dpkg --print-architecture), glibc $(in_chroot ldd --version | head -1 | awk '{print $NF}')"

# File list of the chroot, without what package management and the test itself change.
snapshot() {
    (cd "$CH" && find . -xdev \
        \( -path ./proc -o -path ./dev -o -path ./tmp -o -path ./var/log -o -path ./var/cache/apt \
        -o -path ./var/lib/apt -o -path ./var/cache/debconf -o -path './var/lib/dpkg' \) -prune \
        -o -print) | LC_ALL=C sort
}
# The package lists, for dependencies outside minbase (procps); excluded from the file lists.
cp /etc/resolv.conf "$CH/etc/resolv.conf"
in_chroot apt-get update -qq >"$TMP/update.log" 2>&1 || { cat "$TMP/update.log"; fail "apt-get update in the chroot"; }
snapshot >"$TMP/before"

log "apt-get install $(basename "${debs[0]}") $(basename "${debs[1]}")"
cp "${debs[@]}" "$CH/tmp/"
in_chroot apt-get install -y --no-install-recommends "/tmp/$(basename "${debs[0]}")" "/tmp/$(basename "${debs[1]}")" \
    >"$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log"; fail "apt-get install"; }
grep -E '^(Setting up|Unpacking)' "$TMP/install.log"

log "installed files"
for f in /usr/bin/llamad /usr/bin/llamactl /etc/llamad/llamad.toml /etc/default/llamad \
    /usr/lib/systemd/system/llamad.service /usr/share/man/man8/llamad.8.gz \
    /usr/share/man/man1/llamactl.1.gz /usr/share/bash-completion/completions/llamactl \
    /usr/share/zsh/vendor-completions/_llamactl /usr/share/fish/vendor_completions.d/llamactl.fish \
    /usr/share/bash-completion/completions/llamad /usr/share/zsh/vendor-completions/_llamad \
    /usr/share/fish/vendor_completions.d/llamad.fish; do
    [[ -e $CH$f ]] || fail "$f is not installed"
    echo "ok $f"
done
token=$CH/etc/llamad/admin.token
[[ -f $token ]] || fail "admin token not created"
mode=$(stat -c '%a %U:%G' "$token")
[[ $mode == "600 root:root" ]] || fail "admin token is $mode, expected 600 root:root"
grep -qxE '[0-9a-f]{64}' "$token" || fail "admin token is not 64 hex digits"
echo "ok /etc/llamad/admin.token ($mode, 64 hex digits)"
in_chroot dpkg-query -W -f='${Conffiles}\n' llamad | sed '/^$/d; s/^ */conffile /'

log "llamad check-config"
in_chroot /usr/bin/llamad check-config || fail "llamad check-config exited $?"
echo "check-config: exit 0"
# The shipped file has every key commented out. Uncommented, each documented key must still be
# accepted: the daemon rejects unknown keys, so this catches a file that drifted from the code.
# The keys that name files (the shared secret, the TLS certificate and key) are checked against
# real files, so the example paths are pointed at ones made for this check under /tmp.
mkdir -p "$CH/tmp/keys"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$CH/tmp/keys/rpc.secret"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=localhost \
    -keyout "$CH/tmp/keys/key.pem" -out "$CH/tmp/keys/cert.pem" 2>/dev/null || fail "openssl req"
sed -E 's/^#(\[[a-z_]+\]|[a-z_]+ = )/\1/; s#"/etc/llamad/rpc\.secret"#"/tmp/keys/rpc.secret"#;
    s#"/etc/llamad/tls/(cert|key)\.pem"#"/tmp/keys/\1.pem"#' "$CH/etc/llamad/llamad.toml" >"$CH/tmp/llamad-all-keys.toml"
if in_chroot /usr/bin/llamad check-config --config /tmp/llamad-all-keys.toml >"$TMP/all-keys.log" 2>&1; then
    echo "check-config with every documented key uncommented: exit 0"
else
    sed 's/^/  /' "$TMP/all-keys.log"
    echo "check-config with every documented key uncommented: REJECTED"
    SOFT_FAILED+=("documented configuration keys rejected by llamad check-config")
fi

log "llamad serve --port $PORT --admin-listen 127.0.0.1:$ADMIN_PORT (foreground process in the chroot)"
# chroot and env exec: $! is llamad's own PID (a shell function here would put a subshell between).
# The admin token: under systemd the unit hands /etc/llamad/admin.token over as a credential; in the
# foreground the same file is named with --admin-token-file (llamactl reads it by default).
chroot "$CH" "${CHROOT_ENV[@]}" /usr/bin/llamad serve --port "$PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
    --admin-token-file /etc/llamad/admin.token >"$TMP/server.log" 2>&1 &
SERVER_PID=$!
probe() {
    python3 - "$PORT" <<'EOF'
import socket, struct, sys
# ref: ggml-rpc-protocol.md §6: HELLO = 0x0E, u64 length 24, 24 zero bytes of conn_caps;
# the reply is u64 length 28, then major 7, minor, patch, pad and 24 bytes of conn_caps.
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
buf = b""
while len(buf) < 36:
    chunk = s.recv(36 - len(buf))
    if not chunk:
        break
    buf += chunk
if len(buf) < 12 or struct.unpack("<Q", buf[:8])[0] != 28 or buf[8] != 7:
    print("unexpected HELLO reply: " + buf.hex())
    sys.exit(1)
print(f"HELLO reply: protocol {buf[8]}.{buf[9]}.{buf[10]}")
EOF
}
answered=0
for _ in $(seq 1 100); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        wait "$SERVER_PID" && rc=0 || rc=$?
        SERVER_PID=
        cat "$TMP/server.log"
        fail "llamad serve exited (status $rc) before answering on port $PORT"
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        answered=1
        break
    fi
    sleep 0.2
done
[[ $answered -eq 1 ]] || fail "nothing listens on port $PORT after 20 s"
# llamactl reads the token the package created (/etc/llamad/admin.token) and asks the admin API
# for the daemon's status.
status_ok=0
for _ in $(seq 1 50); do
    if in_chroot /usr/bin/llamactl --server "http://127.0.0.1:$ADMIN_PORT" status >"$TMP/status.out" 2>&1; then
        status_ok=1
        break
    fi
    sleep 0.2
done
sed 's/^/  llamactl: /' "$TMP/status.out"
[[ $status_ok -eq 1 ]] || fail "llamactl status against the admin API on port $ADMIN_PORT"
grep -qE 'protocol +7\.0\.0' "$TMP/status.out" || fail "llamactl status did not report protocol 7.0.0"
echo "llamactl status: exit 0"
probe || fail "HELLO probe"
kill -TERM "$SERVER_PID"
# TimeoutStopSec=30s in the unit: the daemon must be gone by then.
for _ in $(seq 1 150); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.2
done
if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID"
    fail "llamad still runs 30 s after SIGTERM"
fi
wait "$SERVER_PID" && rc=0 || rc=$?
SERVER_PID=
echo "llamad stopped after SIGTERM: exit status $rc"
sed 's/^/  server: /' "$TMP/server.log" | tail -20
[[ $rc -eq 0 ]] || fail "llamad exited $rc on SIGTERM"

log "apt-get purge --autoremove llamad llamactl"
# What systemd creates at the first start with DynamicUser=yes: the real directories under
# private/ and symlinks at the configured paths. The purge must remove them.
for d in lib cache; do
    mkdir -p "$CH/var/$d/private/llamad"
    chmod 0700 "$CH/var/$d/private"
    ln -s private/llamad "$CH/var/$d/llamad"
    echo test >"$CH/var/$d/private/llamad/object"
done
in_chroot apt-get purge -y --autoremove llamad llamactl >"$TMP/purge.log" 2>&1 || { cat "$TMP/purge.log"; fail "apt-get purge"; }
grep -E '^(Removing|Purging)' "$TMP/purge.log"
# systemd's own private/ directories stay: other DynamicUser services share them.
rmdir "$CH/var/lib/private" "$CH/var/cache/private" 2>/dev/null || true
snapshot >"$TMP/after"
if ! diff -u "$TMP/before" "$TMP/after" >"$TMP/diff"; then
    cat "$TMP/diff"
    fail "the purge left files behind (or removed some)"
fi
echo "file lists before installation and after purge are identical ($(wc -l <"$TMP/before") entries)"
if [[ ${#SOFT_FAILED[@]} -gt 0 ]]; then
    printf 'install-test (%s, %s): FAILED: %s\n' "$ARCH" "$SUITE" "${SOFT_FAILED[@]}"
    exit 1
fi
echo "install-test ($ARCH, $SUITE): PASSED"
