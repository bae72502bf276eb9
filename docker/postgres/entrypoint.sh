#!/bin/sh
# The official postgres image's start, in short (docker/postgres/debian.Dockerfile): on an empty
# data folder, initdb with POSTGRES_USER / POSTGRES_PASSWORD, then each
# /docker-entrypoint-initdb.d/*.sh on a socket-only server; then the server, as `postgres`,
# listening on every address with password (scram) logins.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set (see .env.example)}"
export POSTGRES_USER="${POSTGRES_USER:-postgres}" POSTGRES_DB="${POSTGRES_DB:-postgres}"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    chown postgres "$pwfile"
    # UTF8 as the official image: the default here (no locale) is SQL_ASCII, whose text psycopg
    # returns as bytes
    as_postgres initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
        --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    for script in /docker-entrypoint-initdb.d/*.sh; do
        [ -e "$script" ] || continue
        echo "postgres-entrypoint: running $script"
        as_postgres sh "$script"
    done
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
    postgres -D "$PGDATA" -c listen_addresses='*'
