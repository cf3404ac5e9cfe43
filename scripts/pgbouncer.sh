#!/usr/bin/env bash
# A private PgBouncer in transaction mode in front of a Postgres, for the
# tests and the fault suite that run hookinbox through a pooler (Debian's
# pgbouncer package; it refuses to run as root, so it runs as `postgres`).
#
#   scripts/pgbouncer.sh start [PORT] [PG_PORT]   # default 6543 in front of 5432
#   scripts/pgbouncer.sh stop [PORT]              # returns once it has exited
#
# Every database name is passed through (`*`), each server connection gets
# the session settings hookinbox cannot send through the pooler
# (connect_query), and PgBouncer's own idle-in-transaction limit matches.
# The default port is not PgBouncer's usual 6432, which a system PgBouncer
# installed by the package may hold.
set -euo pipefail

action="${1:?usage: scripts/pgbouncer.sh start|stop [PORT] [PG_PORT]}"
port="${2:-6543}"
pg_port="${3:-5432}"
dir="/tmp/hookinbox-pgbouncer-$port"

as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

case "$action" in
  start)
    command -v pgbouncer >/dev/null || { echo "pgbouncer is not installed" >&2; exit 1; }
    if [ -f "$dir/pgbouncer.pid" ] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null; then
      echo "PgBouncer already runs on 127.0.0.1:$port"
      exit 0
    fi
    mkdir -p "$dir"
    cat > "$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$pg_port connect_query='set enable_seqscan = off; set jit = off; set idle_in_transaction_session_timeout = 60000'

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
max_client_conn = 2000
default_pool_size = 20
max_db_connections = 20
max_user_connections = 60
idle_transaction_timeout = 60
server_login_retry = 1
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    printf '"postgres" ""\n"root" ""\n' > "$dir/userlist.txt"
    chown -R postgres:postgres "$dir" 2>/dev/null || true
    as_postgres pgbouncer -d "$dir/pgbouncer.ini"
    for _ in $(seq 1 50); do
      pg_isready -h 127.0.0.1 -p "$port" -U postgres -d postgres -q 2>/dev/null && break
      sleep 0.1
    done
    pg_isready -h 127.0.0.1 -p "$port" -U postgres -d postgres
    ;;
  stop)
    if [ -f "$dir/pgbouncer.pid" ]; then
      . "$(dirname "$0")/lib/procs.sh"
      stop_pids "$(cat "$dir/pgbouncer.pid")"
      rm -f "$dir/pgbouncer.pid"
    fi
    ;;
  *)
    echo "usage: scripts/pgbouncer.sh start|stop [PORT] [PG_PORT]" >&2
    exit 2
    ;;
esac
