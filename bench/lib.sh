# shellcheck shell=bash
# Helpers the bench scripts share. Source it from a script in bench/:
#   . "$(dirname "$0")/lib.sh"

# install_missing <command[:package]>...: installs from Debian's packages the commands that are
# neither on PATH nor in /usr/sbin (the package is named like the command unless given).
install_missing() {
    local missing=() spec
    for spec in "$@"; do
        local command=${spec%%:*} package=${spec#*:}
        command -v "$command" >/dev/null 2>&1 || [ -x "/usr/sbin/$command" ] || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing ${missing[*]} from Debian's packages" >&2
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo apt-get update -qq >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
    fi
}

# target_dir: cargo's target directory (CARGO_TARGET_DIR or ./target).
target_dir() {
    cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'
}

# wait_line <file> <prefix>: the rest of the first line of <file> starting with <prefix>.
wait_line() {
    for _ in $(seq 100); do
        local line
        line=$(grep -m1 "^$2" "$1" 2>/dev/null || true)
        if [ -n "$line" ]; then echo "${line#"$2"}"; return 0; fi
        sleep 0.1
    done
    echo "no '$2' line in $1:" >&2
    cat "$1" >&2
    return 1
}

# free_port: a TCP port of 127.0.0.1 that nothing listens on now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# now_ms: milliseconds since the Unix epoch (the clock idem-load stamps its requests with).
now_ms() {
    date +%s%3N
}

# build_release: builds idem-fixture, idem (with the redis and postgres stores) and idem-load
# (bench/src/bin/idem-load) in release mode, and sets $fixture, $idem and $load to them.
# shellcheck disable=SC2034 # the paths are for the sourcing script
build_release() {
    echo "building idem-fixture, idem (redis, postgres) and idem-load (release)" >&2
    cargo build --release -q -p idem-fixture -p idem-gateway --features idem-gateway/redis,idem-gateway/postgres
    cargo build --release -q -p idem-bench --bin idem-load
    local dir
    dir=$(target_dir)
    fixture="$dir/release/idem-fixture"
    idem="$dir/release/idem"
    load="$dir/release/idem-load"
}

# private_redis: unless REDIS_URL is set, starts a redis-server of this script's own on a free
# port (no persistence) and points REDIS_URL at it, so a benchmark neither fills a shared server
# with its records nor counts another's commands; sets $private_redis_pid (empty when none was
# started: stop it with stop_private_redis). Without redis-server, REDIS_URL stays unset.
private_redis() {
    private_redis_pid=""
    if [ -n "${REDIS_URL:-}" ] || ! command -v redis-server >/dev/null 2>&1; then
        return 0
    fi
    local port
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
    private_redis_pid=$!
    REDIS_URL="redis://127.0.0.1:$port"
    for _ in $(seq 50); do redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

# stop_private_redis: stops the server private_redis started, if it did.
stop_private_redis() {
    if [ -n "${private_redis_pid:-}" ]; then
        kill "$private_redis_pid" 2>/dev/null || true
        wait "$private_redis_pid" 2>/dev/null || true
    fi
}

# nginx_conf <work dir> <upstream HOST:PORT> <listen port> <main directives>: writes
# <work dir>/nginx.conf, nginx as a reverse proxy to the upstream with a keep-alive pool (what
# idem does too; keepalive_requests high both ways, so no connection is closed mid-run), its
# pid, logs and temporary files under <work dir>.
nginx_conf() {
    local work=$1 upstream=$2 port=$3 main=$4
    mkdir -p "$work/nginx"
    cat >"$work/nginx.conf" <<EOF
$main
pid $work/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $work/nginx;
    proxy_temp_path $work/nginx;
    fastcgi_temp_path $work/nginx;
    uwsgi_temp_path $work/nginx;
    scgi_temp_path $work/nginx;
    keepalive_requests 1000000;
    upstream fixture { server $upstream; keepalive 256; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://fixture;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto \$scheme;
        }
    }
}
EOF
}

# load_rate <idem-load> <addr> <wrk script> <connections> <duration>: idem-load rate, the second
# client, in the mode of the wrk script; prints "<requests per second> <p99 ms>".
load_rate() {
    local mode=unique
    [ "$3" = replay.lua ] && mode=replay
    "$1" rate --addr "$2" --mode "$mode" --connections "$4" --duration "$5" --warmup 1s \
        | awk '{ print $1, $2 }'
}

# clients_apart <wrk req/s> <idem-load req/s>: succeeds if the two differ by more than 20%.
clients_apart() {
    awk -v a="$1" -v b="$2" 'BEGIN { r = b > 0 ? a / b : 0; exit !(r > 1.2 || r < 1 / 1.2) }'
}

# report_apart <line>...: the targets whose two clients differ by more than 20%, or that none do.
report_apart() {
    echo
    if [ $# -gt 0 ]; then
        echo "targets whose two clients differ by more than 20% (see bench/README.md for the causes):"
        printf '  %s\n' "$@"
    else
        echo "every target within 20% between the two clients"
    fi
}
