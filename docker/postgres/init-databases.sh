#!/bin/sh
# One PostgreSQL instance, two databases: `prefect` (Prefect server) and `mlflow` (MLflow
# backend store), each owned by its own login role. The postgres image runs this once, when
# its data volume is first initialized; later password changes need ALTER ROLE by hand.
# Names can be changed through the environment (the tests use throw-away names).
set -eu

: "${PREFECT_DB_PASSWORD:?PREFECT_DB_PASSWORD is not set (see .env.example)}"
: "${MLFLOW_DB_PASSWORD:?MLFLOW_DB_PASSWORD is not set (see .env.example)}"

psql -v ON_ERROR_STOP=1 \
  --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" \
  -v prefect_db="${PREFECT_DB_NAME:-prefect}" -v prefect_pw="$PREFECT_DB_PASSWORD" \
  -v mlflow_db="${MLFLOW_DB_NAME:-mlflow}" -v mlflow_pw="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE :"prefect_db" LOGIN PASSWORD :'prefect_pw';
CREATE DATABASE :"prefect_db" OWNER :"prefect_db";
CREATE ROLE :"mlflow_db" LOGIN PASSWORD :'mlflow_pw';
CREATE DATABASE :"mlflow_db" OWNER :"mlflow_db";
-- Prefect's migrations create the pg_trgm extension (trusted: the database owner may)
\connect :"prefect_db"
CREATE EXTENSION IF NOT EXISTS pg_trgm;
SQL
