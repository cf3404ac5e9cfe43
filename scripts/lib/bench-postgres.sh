# The benchmark's own Postgres: a private cluster in a folder of /tmp,
# on a free port, with the recommended settings of bench/postgresql.conf,
# stopped and removed on exit. Source it after scripts/lib/native.sh; it
# points $base (and HOOKINBOX_TEST_POSTGRES) at the new cluster.
#   bench_postgres_start   initdb, start, wait until it answers
# BENCH_POSTGRES=shared keeps the machine's own server instead;
# BENCH_POSTGRES_SETTINGS adds settings (lines of postgresql.conf), such as
# shared_preload_libraries = 'pg_stat_statements' to see where its time goes
# (scripts/bench.sh --cost prints the costliest with BENCH_PG_TOP=N).
pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
bench_pg_dir=""

bench_postgres_start() {
  [ "${BENCH_POSTGRES:-own}" = shared ] && return 0
  # Its own folder: the postgres user cannot enter $work (mode 700).
  bench_pg_dir=$(mktemp -d /tmp/hookinbox-bench-pg.XXXXXX)
  local port; port=$(free_port)
  local as=()
  # initdb refuses to run as root; the cluster belongs to postgres then.
  if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$bench_pg_dir"; as=(runuser -u postgres --); fi
  "${as[@]}" "$pg_bin/initdb" -D "$bench_pg_dir/data" --auth=trust -U postgres >/dev/null
  cp bench/postgresql.conf "$bench_pg_dir/data/hookinbox.conf"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$bench_pg_dir/data/hookinbox.conf"
  echo "include 'hookinbox.conf'" >> "$bench_pg_dir/data/postgresql.conf"
  printf '%s\n' "${BENCH_POSTGRES_SETTINGS:-}" >> "$bench_pg_dir/data/postgresql.conf"
  "${as[@]}" "$pg_bin/pg_ctl" -D "$bench_pg_dir/data" -l "$bench_pg_dir/log" -w \
    -o "-p $port -k $bench_pg_dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
  bench_pg_as=("${as[@]}")
  base="postgres://postgres@127.0.0.1:$port"
  export HOOKINBOX_TEST_POSTGRES="$base"
  bench_pg_port=$port
  on_exit+=(bench_postgres_stop)
}

bench_postgres_stop() {
  [ -n "$bench_pg_dir" ] || return 0
  "${bench_pg_as[@]}" "$pg_bin/pg_ctl" -D "$bench_pg_dir/data" -m fast -w stop >/dev/null 2>&1 || true
  # BENCH_PG_LOG=FILE keeps the server's log (say, auto_explain's plans).
  [ -n "${BENCH_PG_LOG:-}" ] && cp "$bench_pg_dir/log" "$BENCH_PG_LOG"
  rm -rf "$bench_pg_dir"
  bench_pg_dir=""
}
