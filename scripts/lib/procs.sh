# Processes a script started, found and stopped. Source it; it gives:
#   descendants PID [SKIP]
#                       every live process below PID but SKIP and those
#                       below it (by default the caller's own command
#                       substitution), one pid a line
#   stop_pids PID...    SIGTERM to each, then SIGKILL to any still running
#                       after 5 s; returns when all are gone
#   process_leftovers BEFORE ROOT
#                       the processes started since BEFORE (a file of the
#                       pids running then, one a line) that still run and
#                       belong to ROOT: below it, or daemons a test started
#                       (left to init): PgBouncer, a Postgres on a data
#                       directory other than the system's, a RabbitMQ node
#                       other than the system's, hookinbox binaries and the
#                       tests' tools, Node.js, chromedriver, Chromium.
#                       One line each: pid, then its command.

descendants() {
  ps -e -o pid=,ppid= | awk -v root="$1" -v skip="${2:-$BASHPID}" '
    { parent[$1] = $2 }
    END {
      for (p in parent) {
        q = p
        while (q in parent && q != root && q != skip && q > 1) q = parent[q]
        if (q == root && p != root) print p
      }
    }'
}

# True while PID is there: running, or a daemon's zombie that init has not
# reaped yet (pgrep still lists it). A zombie of this shell's own, reaped
# only by its `wait`, counts as gone.
present() {
  local state ppid
  read -r state ppid < <(ps -o stat=,ppid= -p "$1" 2>/dev/null) || return 1
  [ -n "$state" ] || return 1
  [ "${state#Z}" = "$state" ] || [ "$ppid" = 1 ]
}

stop_pids() {
  [ "$#" -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  local left=("$@") still _
  for _ in $(seq 1 50); do
    still=()
    for pid in "${left[@]}"; do present "$pid" && still+=("$pid"); done
    [ "${#still[@]}" -eq 0 ] && return 0
    left=("${still[@]}")
    sleep 0.1
  done
  kill -9 "${left[@]}" 2>/dev/null || true
}

process_leftovers() {
  local before="$1" root="$2" self="$BASHPID" below
  below=" $(descendants "$root" "$self" | tr '\n' ' ') "
  ps -e -o pid=,ppid=,stat=,args= | while read -r pid ppid stat args; do
    grep -qx "$pid" "$before" && continue
    case "$stat" in Z*) continue ;; esac
    case "$below" in *" $pid "*) echo "$pid $args"; continue ;; esac
    [ "$ppid" = 1 ] || continue
    case "$args" in
      *pgbouncer*) ;;
      *postgres\ -D\ /var/lib/postgresql/*) continue ;;
      */postgres\ -D\ *) ;;
      *beam.smp*/var/lib/rabbitmq*) continue ;;
      *beam.smp*) ;;
      *hookinbox-ingest* | *hookinbox-worker* | *loadgen* | *destbench* | *httpbench* | *mqbench* \
        | *bodyshare* | *closedloop* | *poolbench* | */faults\ * | *prometheus\ --config* \
        | node\ * | */node\ * | *chromedriver* | *chromium* | *chrome\ *) ;;
      *) continue ;;
    esac
    echo "$pid $args"
  done
}
