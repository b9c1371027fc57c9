#!/bin/sh
# Bootstrap of the single-host demo OpenBao in docker-compose.yml (POSIX sh; runs in the official openbao/openbao
# image, whose busybox and `bao` are all it needs).
#
#   bootstrap.sh serve   start `bao server -config=$OPENBAO_CONFIG`, bootstrap it, renew Lethe's token every
#                        $OPENBAO_RENEW_S seconds, and stop with the server (the compose service's entrypoint)
#   bootstrap.sh         bootstrap the server at $BAO_ADDR once and exit (0: ready for Lethe)
#
# Bootstrapping, idempotent across restarts (nothing is ever initialised over existing data):
#   1. wait for the server to answer;
#   2. initialise it if it never was (one key share), keeping the unseal key and the root token in
#      $OPENBAO_BOOTSTRAP_DIR;
#   3. unseal it with that key (every start: OpenBao starts sealed);
#   4. enable a KV version 2 engine at secret/ if there is none;
#   5. write the `lethe` policy (lethe-policy.hcl, the policy docs/erasure-at-rest.md documents);
#   6. make sure a renewable periodic token whose id is $LETHE_OPENBAO_TOKEN exists with that policy (created when
#      missing, e.g. expired while the stack was down; renewed otherwise).
#
# DEMO ONLY: the unseal key and the root token lie on the same volume as the data they protect, so whoever copies
# the volume (or a snapshot of it) holds the keys too, and a backup of the volume holds every key cover as it was,
# forgotten ones included. Production runs OpenBao with auto-unseal (a cloud KMS, a transit seal or an HSM), never
# keeps the unseal material beside the storage, revokes the root token after setup, and keeps storage backups no
# longer than forgotten data may live (docs/erasure-at-rest.md, "The guarantee" and "Deployments").
#
# Environment:
#   BAO_ADDR                 the server (default http://127.0.0.1:8200)
#   LETHE_OPENBAO_TOKEN      the id of Lethe's token (required; no "." in it)
#   OPENBAO_BOOTSTRAP_DIR    where the unseal key and root token are kept (default /openbao/file/bootstrap)
#   OPENBAO_CONFIG           the server's config in `serve` mode (default: openbao.hcl beside this script)
#   OPENBAO_POLICY           the policy file (default: lethe-policy.hcl beside this script)
#   OPENBAO_TOKEN_PERIOD     the token's period (default 24h): it lives that long after its last renewal
#   OPENBAO_RENEW_S          `serve` mode's renewal interval in seconds (default 3600)
#   OPENBAO_WAIT_S           how long to wait for the server (default 60 seconds)
#   BAO_BIN                  the `bao` binary (default: bao on PATH)

set -eu

here=$(cd "$(dirname "$0")" && pwd)
BAO_BIN=${BAO_BIN:-bao}
BAO_ADDR=${BAO_ADDR:-http://127.0.0.1:8200}
OPENBAO_BOOTSTRAP_DIR=${OPENBAO_BOOTSTRAP_DIR:-/openbao/file/bootstrap}
OPENBAO_CONFIG=${OPENBAO_CONFIG:-$here/openbao.hcl}
OPENBAO_POLICY=${OPENBAO_POLICY:-$here/lethe-policy.hcl}
OPENBAO_TOKEN_PERIOD=${OPENBAO_TOKEN_PERIOD:-24h}
OPENBAO_RENEW_S=${OPENBAO_RENEW_S:-3600}
OPENBAO_WAIT_S=${OPENBAO_WAIT_S:-60}
export BAO_ADDR
unset BAO_TOKEN || true

unseal_key_file=$OPENBAO_BOOTSTRAP_DIR/unseal-key
root_token_file=$OPENBAO_BOOTSTRAP_DIR/root-token
init_output=$OPENBAO_BOOTSTRAP_DIR/init.out

log() {
    echo "openbao-bootstrap: $*" >&2
}

die() {
    log "ERROR: $*"
    exit 1
}

bao() {
    "$BAO_BIN" "$@"
}

# The server's seal status as JSON (works sealed and unsealed; `bao status` exits 2 when sealed).
seal_status() {
    bao status -format=json 2>/dev/null || true
}

wait_for_server() {
    waited=0
    while :; do
        rc=0
        bao status >/dev/null 2>&1 || rc=$?
        if [ -n "${OPENBAO_SERVER_PID:-}" ] && ! kill -0 "$OPENBAO_SERVER_PID" 2>/dev/null; then
            die "the server (pid $OPENBAO_SERVER_PID) exited"  # `serve`: never bootstrap another one on that port
        fi
        if [ "$rc" -eq 0 ] || [ "$rc" -eq 2 ]; then
            return 0
        fi
        if [ "$waited" -ge "$((OPENBAO_WAIT_S * 5))" ]; then
            die "no OpenBao server answers at $BAO_ADDR after ${OPENBAO_WAIT_S} s"
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
}

initialise() {
    if printf '%s' "$(seal_status)" | grep -q '"initialized": *true'; then
        [ -s "$unseal_key_file" ] && [ -s "$root_token_file" ] && return 0
        # An init whose output was written but not split into the two files (killed in between): finish it.
        if [ -s "$init_output" ] && grep -q '^Unseal Key 1:' "$init_output"; then
            split_init_output
            return 0
        fi
        die "the server at $BAO_ADDR is initialised but $OPENBAO_BOOTSTRAP_DIR holds no unseal key: it cannot be" \
            "unsealed from here. Restore the unseal key and root token there; never re-initialise (that would" \
            "start an empty key store, and Lethe would refuse it)."
    fi
    if [ -s "$unseal_key_file" ]; then
        die "$unseal_key_file exists but the server at $BAO_ADDR was never initialised: its storage is not the one" \
            "these keys belong to (a lost or replaced volume). Not initialising over it; move the directory away" \
            "only if that store is really gone."
    fi
    log "initialising $BAO_ADDR (1 key share, DEMO: the key is kept in $OPENBAO_BOOTSTRAP_DIR)"
    mkdir -p "$OPENBAO_BOOTSTRAP_DIR" && chmod 700 "$OPENBAO_BOOTSTRAP_DIR" \
        || die "cannot write to $OPENBAO_BOOTSTRAP_DIR"
    if ! (umask 077 && bao operator init -key-shares=1 -key-threshold=1 >"$init_output"); then
        rm -f "$init_output"
        die "bao operator init failed"
    fi
    split_init_output
}

split_init_output() {
    key=$(awk '/^Unseal Key 1:/ { print $NF }' "$init_output")
    root=$(awk '/^Initial Root Token:/ { print $NF }' "$init_output")
    [ -n "$key" ] && [ -n "$root" ] || die "could not read the unseal key and root token from $init_output"
    (
        umask 077
        printf '%s' "$key" >"$unseal_key_file.tmp"
        printf '%s' "$root" >"$root_token_file.tmp"
    )
    mv "$unseal_key_file.tmp" "$unseal_key_file" && mv "$root_token_file.tmp" "$root_token_file" \
        || die "could not keep the unseal key and root token in $OPENBAO_BOOTSTRAP_DIR"
    sync
    rm -f "$init_output"
}

unseal() {
    if printf '%s' "$(seal_status)" | grep -q '"sealed": *false'; then
        return 0
    fi
    log "unsealing $BAO_ADDR"
    # key=@file: the key never appears on a command line.
    bao write -format=json sys/unseal key=@"$unseal_key_file" >/dev/null || die "unsealing failed"
    tries=0
    until bao status >/dev/null 2>&1; do  # 0 once unsealed
        [ "$tries" -lt 300 ] || die "the server did not unseal"
        sleep 0.1
        tries=$((tries + 1))
    done
}

login() {
    BAO_TOKEN=$(cat "$root_token_file")
    export BAO_TOKEN
    tries=0
    until bao token lookup >/dev/null 2>&1; do  # a fresh Raft node answers once it has become the leader
        [ "$tries" -lt 300 ] || die "the root token is refused by $BAO_ADDR"
        sleep 0.1
        tries=$((tries + 1))
    done
}

enable_kv() {
    if bao read -format=json sys/mounts/secret >/dev/null 2>&1; then
        bao read -format=json sys/mounts/secret | grep -q '"version": *"2"' \
            || die "secret/ is mounted but is not a KV version 2 engine"
        return 0
    fi
    log "enabling KV version 2 at secret/"
    bao secrets enable -path=secret -version=2 kv >/dev/null || die "could not enable KV version 2 at secret/"
}

write_policy() {
    bao policy write lethe "$OPENBAO_POLICY" >/dev/null || die "could not write the lethe policy"
}

ensure_token() {
    if lookup=$(bao token lookup -format=json "$LETHE_OPENBAO_TOKEN" 2>/dev/null); then
        if printf '%s' "$lookup" | tr -d ' \n' | grep -q '"policies":\[[^]]*"lethe"'; then
            bao token renew "$LETHE_OPENBAO_TOKEN" >/dev/null || die "could not renew Lethe's token"
            return 0
        fi
        log "a token with Lethe's id exists without the lethe policy: revoking it"
        bao token revoke "$LETHE_OPENBAO_TOKEN" >/dev/null || die "could not revoke it"
    fi
    log "creating Lethe's token (policy lethe, period $OPENBAO_TOKEN_PERIOD)"
    bao token create -id="$LETHE_OPENBAO_TOKEN" -policy=lethe -period="$OPENBAO_TOKEN_PERIOD" -orphan \
        -display-name=lethe >/dev/null || die "could not create Lethe's token"
}

bootstrap() {
    [ -n "${LETHE_OPENBAO_TOKEN:-}" ] || die "LETHE_OPENBAO_TOKEN is not set"
    case $LETHE_OPENBAO_TOKEN in
        *.*) die "LETHE_OPENBAO_TOKEN may not contain a '.'" ;;
    esac
    [ -r "$OPENBAO_POLICY" ] || die "no policy file at $OPENBAO_POLICY"
    wait_for_server
    initialise
    unseal
    login
    enable_kv
    write_policy
    ensure_token
    unset BAO_TOKEN
    log "ready: KV v2 at secret/, policy lethe, Lethe's token valid"
}

renew_forever() {
    sleeper=
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM INT
    while :; do
        sleep "$OPENBAO_RENEW_S" &
        sleeper=$!
        wait "$sleeper" || true
        BAO_TOKEN=$LETHE_OPENBAO_TOKEN "$BAO_BIN" token renew >/dev/null || log "renewing Lethe's token failed"
    done
}

serve() {
    "$BAO_BIN" server -config="$OPENBAO_CONFIG" &
    server=$!
    renewer=
    trap 'kill -TERM "$server" 2>/dev/null || true' TERM INT
    # A shell of its own, so that `set -e` holds inside it (an `if` would suspend it).
    if ! OPENBAO_SERVER_PID=$server sh "$0" || ! kill -0 "$server" 2>/dev/null; then
        kill -TERM "$server" 2>/dev/null || true
        wait "$server" || true
        exit 1
    fi
    renew_forever &
    renewer=$!
    status=0
    wait "$server" || status=$?
    while kill -0 "$server" 2>/dev/null; do  # a trapped signal interrupts `wait`: wait for the server's exit
        status=0
        wait "$server" || status=$?
    done
    kill -TERM "$renewer" 2>/dev/null || true
    wait "$renewer" 2>/dev/null || true
    exit "$status"
}

case ${1:-} in
    serve) serve ;;
    "") bootstrap ;;
    *) die "usage: $0 [serve]" ;;
esac
