# MLflow tracking server with the drivers the compose stack needs: PostgreSQL backend store
# (psycopg 3: SQLAlchemy 2.1's driver for postgresql:// URIs) and artifacts on MinIO through
# the S3 API (boto3). Clients upload artifacts through this server (--serve-artifacts), so they
# need neither driver nor S3 credentials.
#
# BASE_IMAGE: any Debian bookworm image (python3 is installed where it lacks one), as
# docker/Dockerfile.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
       $(command -v python3 >/dev/null || echo python3 python3-venv) \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
RUN pip install mlflow==3.17.2 'psycopg[binary]==3.3.9' boto3==1.44.5
