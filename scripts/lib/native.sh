# Shared by the scripts that run hookinbox natively against the local
# Postgres and RabbitMQ. Source it from the repository root. It gives:
#   free_port        a free local TCP port
#   scratch_db NAME  creates database NAME, dropped on exit, and deletes
#                    the queues of prefix NAME on exit (its work queue,
#                    each destination's NAME.work.*, its dead-letter queue)
#   pids+=(PID)      background processes, stopped on exit; so is anything
#                    else still running below the script (a load generator,
#                    wrk, a receiver), however it ends: done, failed, or
#                    interrupted
#   $work            a temporary folder, removed on exit
#   $base            the Postgres server URL (HOOKINBOX_TEST_POSTGRES)
#   on_exit+=(CMD)   commands run on exit, after the databases are dropped
#                    and before $work is removed
. scripts/lib/procs.sh
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
  # shellcheck disable=SC2046
  stop_pids "${pids[@]}" $(descendants $$)
  wait 2>/dev/null || true
  local queues=""
  if [ "${#dbs[@]}" -gt 0 ]; then
    queues=$(rabbitmqctl -q list_queues name 2>/dev/null || true)
  fi
  for db in "${dbs[@]}"; do
    psql -q "$base/postgres" -c "drop database if exists $db with (force)" 2>/dev/null || true
    # A stack's queues outlive it on the shared broker; a backlog left
    # there costs RabbitMQ memory and CPU in every later run.
    for q in "$db.work" "$db.dlq" $(awk -v p="$db.work." 'index($0, p) == 1' <<<"$queues"); do
      rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true
    done
  done
  for cmd in "${on_exit[@]}"; do $cmd; done
  rm -rf "$work"
}
trap native_cleanup EXIT
