# Shared by the scripts that run hookinbox natively against the local
# Postgres and RabbitMQ. Source it from the repository root. It gives:
#   free_port        a free local TCP port
#   scratch_db NAME  creates database NAME, dropped on exit, and deletes
#                    the queues of prefix NAME on exit
#   pids+=(PID)      background processes, killed on exit
#   $work            a temporary folder, removed on exit
#   $base            the Postgres server URL (HOOKINBOX_TEST_POSTGRES)
#   on_exit+=(CMD)   commands run on exit, after the databases are dropped
#                    and before $work is removed
base="${HOOKINBOX_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}"
pids=()
dbs=()
on_exit=()
work="$(mktemp -d)"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

scratch_db() {
  psql -q "$base/postgres" -c "create database $1"
  dbs+=("$1")
}

native_cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for db in "${dbs[@]}"; do
    psql -q "$base/postgres" -c "drop database if exists $db with (force)" 2>/dev/null || true
    # A stack's queues outlive it on the shared broker; a backlog left
    # there costs RabbitMQ memory and CPU in every later run.
    for q in "$db.work" "$db.dlq"; do
      rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true
    done
  done
  for cmd in "${on_exit[@]}"; do $cmd; done
  rm -rf "$work"
}
trap native_cleanup EXIT
