# What the tests and a local stack need on a Debian 12 machine, installed
# from Debian at pinned versions, without a question, and only when
# missing: Postgres and RabbitMQ (started when they are down), and the
# test tools (cargo-nextest; Chromium and its chromedriver for the admin
# console's browser tests; PgBouncer for `scripts/test.sh
# --through-pgbouncer`). Shared by .ci/run, scripts/test.sh and
# scripts/run-local.sh. Source it from the repository root; it gives:
#
#   services_up            Postgres on 127.0.0.1:5432 (user postgres, no
#                          password from loopback) and RabbitMQ on
#                          127.0.0.1:5672 (guest/guest): installed if
#                          missing, started if down, waited for
#   ensure_nextest         cargo-nextest, pinned
#   ensure_chromium        chromium and chromium-driver, pinned
#   ensure_pgbouncer       pgbouncer, pinned
#   ensure_node            nodejs and npm, pinned (the octokit app the
#                          tests run downstream of hookinbox)
#
# It never stops or restarts a service that is up.
#
# HOOKINBOX_INSTALL_DRY_RUN=1 prints each command that would change the
# machine (an install, a configuration, a start) instead of running it;
# HOOKINBOX_PRETEND_MISSING="postgres rabbitmq" (dry runs only) takes those
# for absent, to show what a fresh machine would get.

POSTGRES_MAJOR=15
POSTGRES_VERSION=15.20-0+deb12u1
RABBITMQ_VERSION=3.10.8-1.1+deb12u1
NEXTEST_VERSION=0.9.143
# The admin console's browser tests drive Debian's Chromium through its
# chromedriver; both pinned to the same build (when the security archive
# has replaced it, services_apt_version says so and takes its newest).
CHROMIUM_VERSION=156.0.8078.129-1~deb12u1
# The core paths also run through a real PgBouncer (transaction mode).
PGBOUNCER_VERSION=1.18.0-1+deb12u1
# The tests run an unmodified @octokit/webhooks app (tests/octokit-app,
# pinned by its lock file to a release that supports Node.js 18) downstream
# of hookinbox: Debian's Node.js and npm.
NODEJS_VERSION=18.20.4+dfsg-1~deb12u3
NPM_VERSION=9.2.0~ds1-1

services_dry_run() { [ "${HOOKINBOX_INSTALL_DRY_RUN:-}" = 1 ]; }

# Runs a command that changes the machine, or prints it in a dry run.
services_do() {
  if services_dry_run; then
    printf 'would run: %s\n' "$*"
  else
    "$@"
  fi
}

# Whether `what` (postgres, rabbitmq) is to be taken for absent.
services_pretend_missing() {
  services_dry_run && [[ " ${HOOKINBOX_PRETEND_MISSING:-} " == *" $1 "* ]]
}

services_sudo=""
if [ "$(id -u)" -ne 0 ]; then services_sudo="sudo"; fi
services_apt_updated=""

# The version of `name` to install for the pin `version`: the pin itself
# when Debian's archive still offers it. The security archive keeps only
# its newest build of a package (Chromium moves every few weeks, a major
# release every month or so), so a pin it has replaced falls back to the
# newest offered build of the same major release, or failing that to the
# newest offered at all, said on standard error: a pin that has left the
# archive must not stop a fresh machine from testing.
services_apt_version() {
  local name=$1 pin=$2 offered best what="its newest build of the same major release"
  offered=$(apt-cache madison "$name" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}')
  if [ -z "$offered" ] || grep -qxF -- "$pin" <<<"$offered"; then
    printf '%s\n' "$pin"
    return 0
  fi
  best=$(awk -v major="${pin%%.*}." 'index($0, major) == 1' <<<"$offered" | services_apt_newest)
  if [ -z "$best" ]; then
    best=$(services_apt_newest <<<"$offered")
    what="the newest it offers (none of the pin's major release is left)"
  fi
  printf '%s: the pinned %s is no longer in the archive; installing %s, %s\n' \
    "$name" "$pin" "$best" "$what" >&2
  printf '%s\n' "$best"
}

# The newest of the Debian versions on standard input, one a line, by
# Debian's ordering (`~` sorts before anything).
services_apt_newest() {
  local version newest=""
  while read -r version; do
    [ -n "$version" ] || continue
    if [ -z "$newest" ] || dpkg --compare-versions "$version" gt "$newest"; then
      newest=$version
    fi
  done
  printf '%s\n' "$newest"
}

# apt-get install of pinned packages (`name=version`), non-interactive.
services_apt_install() {
  if [ -z "$services_apt_updated" ]; then
    services_do $services_sudo apt-get update -qq
    services_apt_updated=1
  fi
  local wanted=() spec version
  for spec in "$@"; do
    version=$(services_apt_version "${spec%%=*}" "${spec#*=}")
    wanted+=("${spec%%=*}=$version")
  done
  services_do $services_sudo env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${wanted[@]}"
}

postgres_installed() {
  ! services_pretend_missing postgres \
    && command -v pg_ctlcluster >/dev/null 2>&1 \
    && [ -d "/etc/postgresql/$POSTGRES_MAJOR/main" ]
}

postgres_up() {
  ! services_pretend_missing postgres && pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null
}

rabbitmq_installed() {
  ! services_pretend_missing rabbitmq && command -v rabbitmq-server >/dev/null 2>&1
}

rabbitmq_up() {
  ! services_pretend_missing rabbitmq && rabbitmq-diagnostics -q ping >/dev/null 2>&1
}

# Postgres answering on 127.0.0.1:5432 is enough, however it got there;
# otherwise Debian's cluster is installed if missing, then started.
ensure_postgres() {
  if postgres_up; then
    echo "postgres: up on 127.0.0.1:5432"
    return 0
  fi
  if ! postgres_installed; then
    echo "postgres: installing postgresql-$POSTGRES_MAJOR $POSTGRES_VERSION from Debian"
    services_apt_install "postgresql-$POSTGRES_MAJOR=$POSTGRES_VERSION" \
      "postgresql-client-$POSTGRES_MAJOR=$POSTGRES_VERSION"
    # A fresh cluster asks loopback clients for a password; the tests and
    # the local stack connect as postgres without one (a development
    # machine's setting, never a server's). The first matching line wins.
    services_do $services_sudo sed -i \
      '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' \
      "/etc/postgresql/$POSTGRES_MAJOR/main/pg_hba.conf"
    # The package may have started the cluster already: it reads the
    # file again.
    if postgres_up; then
      services_do $services_sudo pg_ctlcluster --skip-systemctl-redirect "$POSTGRES_MAJOR" main reload
      return 0
    fi
  fi
  echo "postgres: starting cluster $POSTGRES_MAJOR/main"
  services_do $services_sudo pg_ctlcluster --skip-systemctl-redirect "$POSTGRES_MAJOR" main start
  services_dry_run && return 0
  for _ in $(seq 1 60); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
  pg_isready -h 127.0.0.1 -p 5432
}

# RabbitMQ answering a ping is enough; otherwise Debian's is installed if
# missing, then started.
ensure_rabbitmq() {
  if rabbitmq_up; then
    echo "rabbitmq: up on 127.0.0.1:5672"
    return 0
  fi
  if ! rabbitmq_installed; then
    echo "rabbitmq: installing rabbitmq-server $RABBITMQ_VERSION from Debian"
    services_apt_install "rabbitmq-server=$RABBITMQ_VERSION"
  fi
  if ! rabbitmq_up; then
    echo "rabbitmq: starting"
    services_do $services_sudo rabbitmq-server -detached
  fi
  services_dry_run && return 0
  $services_sudo rabbitmqctl -q await_startup --timeout 120
}

services_up() {
  ensure_postgres
  ensure_rabbitmq
}

# What earlier runs of the tests and scripts left on the shared services
# when they were killed or failed before their cleanup: test databases
# (hookinbox_test_<32 hex>, bench_*, bodyattacks_*, abuse_*) and queues
# (test-<32 hex>.*, and the scripts' prefixes). Hundreds of leftover quorum
# queues keep a small broker busy enough to refuse new connections, so a
# run starts by removing them. Only for a machine where no other run of
# the tests is going on (CI, a contributor's own machine).
sweep_leftovers() {
  local pattern='^(test-[0-9a-f]{32}|bench_[0-9a-z_]+|bodyattacks_[0-9]+|abuse_[0-9]+)\.'
  local queues dbs
  queues=$(rabbitmqctl -q list_queues name 2>/dev/null | grep -E "$pattern" || true)
  dbs=$(psql -tAq "${HOOKINBOX_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}/postgres" \
    -c "select datname from pg_database where datname ~ '^(hookinbox_test_[0-9a-f]{32}|bench_[0-9a-z_]+|bodyattacks_[0-9]+|abuse_[0-9]+)$'" || true)
  echo "leftovers of earlier runs: $(wc -w <<<"$queues") queues, $(wc -w <<<"$dbs") databases"
  for q in $queues; do rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true; done
  for db in $dbs; do
    psql -q "${HOOKINBOX_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}/postgres" \
      -c "drop database if exists $db with (force)" >/dev/null 2>&1 || true
  done
}

ensure_nextest() {
  if cargo nextest --version >/dev/null 2>&1; then return 0; fi
  echo "cargo-nextest: installing $NEXTEST_VERSION"
  services_do cargo install cargo-nextest --locked --version "$NEXTEST_VERSION"
}

ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    return 0
  fi
  echo "chromium: installing $CHROMIUM_VERSION from Debian"
  services_apt_install "chromium=$CHROMIUM_VERSION" "chromium-driver=$CHROMIUM_VERSION"
}

ensure_pgbouncer() {
  if command -v pgbouncer >/dev/null 2>&1; then return 0; fi
  echo "pgbouncer: installing $PGBOUNCER_VERSION from Debian"
  services_apt_install "pgbouncer=$PGBOUNCER_VERSION"
}

# Node.js and npm, only when either is missing (a machine may have a newer
# Node.js from elsewhere, with its own npm: the app runs on 18 and later).
ensure_node() {
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    return 0
  fi
  echo "nodejs: installing $NODEJS_VERSION and npm $NPM_VERSION from Debian"
  services_apt_install "nodejs=$NODEJS_VERSION" "npm=$NPM_VERSION"
}
