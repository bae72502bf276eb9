# syntax=docker/dockerfile:1
# MLflow tracking server with the drivers the compose stack needs: PostgreSQL backend store
# (psycopg 3: SQLAlchemy 2.1's driver for postgresql:// URIs) and artifacts on MinIO through the S3 API (boto3). Clients upload artifacts
# through this server (--serve-artifacts), so they need neither driver nor S3 credentials.
FROM ghcr.io/mlflow/mlflow:v3.17.2
RUN pip install --no-cache-dir 'psycopg[binary]==3.3.9' boto3==1.44.5
