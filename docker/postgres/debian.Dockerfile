# A stand-in for the postgres:16 image where no image registry is reachable (`make stack-test`):
# Debian's PostgreSQL 15 on a Debian base, started by entrypoint.sh the way the official image
# starts (POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB, /docker-entrypoint-initdb.d/*.sh run
# once on an empty data folder, the data in /var/lib/postgresql/data).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# no `main` cluster at install time: the entrypoint makes the one cluster, in the volume
RUN mkdir -p /etc/postgresql-common \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
