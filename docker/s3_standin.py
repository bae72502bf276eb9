"""The stack test's S3 server in place of MinIO: moto's S3 server on port 9000, whose objects
outlive the container as MinIO's do in its volume.

moto keeps objects in memory. Its request recorder (``MOTO_ENABLE_RECORDING``) appends every
request to ``MOTO_RECORDER_FILEPATH``, a file in the ``minio-data`` volume; at start, a
recording left by an earlier container is replayed into the new server before it reports
ready (``/tmp/ready``, the health check's file), so `docker compose down` and `up` keep the
buckets and their objects."""

from __future__ import annotations

import os
import threading
import urllib.request
from pathlib import Path

from moto.server import ThreadedMotoServer

PORT = 9000
READY = Path("/tmp/ready")


def main() -> None:
    recording = Path(os.environ["MOTO_RECORDER_FILEPATH"])
    READY.unlink(missing_ok=True)
    server = ThreadedMotoServer(ip_address="0.0.0.0", port=PORT, verbose=False)
    server.start()
    if recording.is_file() and recording.stat().st_size:
        lines = len(recording.read_text().splitlines())
        replay = urllib.request.Request(
            f"http://127.0.0.1:{PORT}/moto-api/recorder/replay-recording", method="POST"
        )
        with urllib.request.urlopen(replay, timeout=600) as response:
            response.read()
        print(f"replayed {lines} recorded requests from {recording}", flush=True)
    READY.touch()
    print(f"S3 (moto) on port {PORT}, recording to {recording}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
