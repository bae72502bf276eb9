# A stand-in for MinIO and its `mc` client where no image registry is reachable (`make
# stack-test`): moto's S3 server (the integration tests' S3 API) and boto3 for the buckets.
# docker/s3_standin.py keeps moto's objects across restarts, in the minio-data volume.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
       $(command -v python3 >/dev/null || echo python3 python3-venv) \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
RUN pip install 'moto[server]==5.2.5' boto3==1.43.117
COPY s3_standin.py /usr/local/bin/s3_standin.py
