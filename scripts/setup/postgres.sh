#!/usr/bin/env bash
# Make Debian's PostgreSQL 15 available for the distributed-store tests:
# cluster "15 main" running on 127.0.0.1:5432, role amber/amber owning the
# database amber_test. Idempotent; when everything is already in place it only
# connects once and prints the DSN.
#
# pg_ctlcluster is used directly (not systemctl) because these machines run
# without systemd.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Overridable (e.g. to exercise this script on a scratch cluster).
PG_VERSION=15
PG_CLUSTER=${AMBER_PG_CLUSTER:-main}
PG_HOST=127.0.0.1
PG_PORT=${AMBER_PG_PORT:-5432}
PG_USER=amber
PG_PASSWORD=amber
PG_DB=amber_test
DSN="postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$PG_PORT/$PG_DB?sslmode=disable"

# dsn_works: the role can log in with its password over TCP and owns the db.
dsn_works() {
    command -v psql >/dev/null || return 1
    local owner
    owner=$(PGCONNECT_TIMEOUT=3 psql "$DSN" -qAtX -c \
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()" 2>/dev/null) || return 1
    [[ $owner == "$PG_USER" ]]
}

as_postgres_psql() { (cd / && runuser -u postgres -- psql -p "$PG_PORT" -d postgres -qAtX -v ON_ERROR_STOP=1 "$@"); }

if dsn_works; then
    log "PostgreSQL $PG_VERSION/$PG_CLUSTER is up and $PG_USER owns $PG_DB"
    echo "$DSN"
    exit 0
fi

need_root
# Debian 12 ships PostgreSQL 15; the package's postinst creates cluster 15/main.
apt_install "postgresql-$PG_VERSION" postgresql-client-common

if ! pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$PG_CLUSTER" '$1 == v && $2 == c {found=1} END {exit !found}'; then
    log "pg_createcluster $PG_VERSION $PG_CLUSTER --port $PG_PORT"
    pg_createcluster "$PG_VERSION" "$PG_CLUSTER" --port "$PG_PORT" >&2 || die "pg_createcluster failed"
fi

read -r _ _ port status _ < <(pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$PG_CLUSTER" '$1 == v && $2 == c')
[[ $port == "$PG_PORT" ]] || die "cluster $PG_VERSION/$PG_CLUSTER uses port $port, not $PG_PORT (another cluster holds $PG_PORT?)"

# Debian's default listen_addresses is 'localhost'; make sure 127.0.0.1 is in it.
listen=$(pg_conftool -s "$PG_VERSION" "$PG_CLUSTER" show listen_addresses 2>/dev/null || echo localhost)
listen=${listen//\'/}
if [[ $listen != *localhost* && $listen != *127.0.0.1* && $listen != '*' ]]; then
    log "listen_addresses='$listen' -> adding 127.0.0.1"
    pg_conftool "$PG_VERSION" "$PG_CLUSTER" set listen_addresses "$listen,127.0.0.1"
    [[ $status == online* ]] && { pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" restart >&2 || die "restart failed"; }
fi

if [[ $status != online* ]]; then
    log "pg_ctlcluster $PG_VERSION $PG_CLUSTER start"
    pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" start >&2 \
        || die "pg_ctlcluster $PG_VERSION $PG_CLUSTER start failed (see /var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log)"
fi
for _ in $(seq 1 60); do
    pg_isready -q -h "$PG_HOST" -p "$PG_PORT" && break
    sleep 0.5
done
pg_isready -q -h "$PG_HOST" -p "$PG_PORT" || die "PostgreSQL not accepting connections on $PG_HOST:$PG_PORT"

# Role and database; ALTER keeps a pre-existing role's password in line.
as_postgres_psql <<SQL || die "creating role $PG_USER failed"
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
        CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD';
    ELSE
        ALTER ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD';
    END IF;
END
\$\$;
SQL
if [[ $(as_postgres_psql -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") != 1 ]]; then
    log "CREATE DATABASE $PG_DB OWNER $PG_USER"
    as_postgres_psql -c "CREATE DATABASE $PG_DB OWNER $PG_USER" || die "creating database $PG_DB failed"
else
    as_postgres_psql -c "ALTER DATABASE $PG_DB OWNER TO $PG_USER" || die "ALTER DATABASE $PG_DB failed"
fi

dsn_works || die "cannot connect with $DSN (check pg_hba.conf allows scram/md5 on $PG_HOST)"
log "PostgreSQL $PG_VERSION/$PG_CLUSTER ready"
echo "$DSN"
