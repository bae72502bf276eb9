#!/usr/bin/env bash
# `make stack-test`, in the cpu worker: DVC through the stack's bucket. The tiny project
# (tests/integration/stack/tiny_project.py, its params.yaml given as $1) is reproduced with
# `dvc repro evaluate` in a copy of the code, pushed to the remote of docker-compose.yml's
# `dvc-remote` config (the dvc bucket), and pulled into a second, clean copy that holds only what
# git would (code, params.yaml, dvc.lock, metrics): there DVC must find every stage up to date
# (`evaluate` and the stages before it) and the pulled files byte for byte those of the first
# copy.
set -euo pipefail
config=$(realpath "$1")
src=$(dirname "$config")/src
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the code of the image without the pipeline's files (volumes) or any DVC cache
code() {
    mkdir -p "$1"
    tar -C /app --exclude=./data --exclude=./metrics --exclude=./artifacts --exclude=./runs \
        --exclude=./.dvc/cache --exclude=./.sidrec-cache --exclude=./dvc.lock -c . | tar -C "$1" -x
    mkdir -p "$1/${src#/app/}"
    cp -a "$src/." "$1/${src#/app/}/"
}
# every file DVC put in the workspace (the stages' outputs), with its checksum
outputs() { (cd "$1" && find data artifacts -type f ! -path "${src#/app/}/*" -print0 | sort -z | xargs -0 md5sum); }

code "$work/made"
cp "$config" "$work/made/params.yaml"
cd "$work/made"
echo "dvc repro evaluate (the tiny project) in $work/made" >&2
dvc repro evaluate >"$work/repro.log" 2>&1 || { tail -30 "$work/repro.log" >&2; exit 1; }
dvc push
outputs "$work/made" >"$work/made.md5"

code "$work/pulled"
cp params.yaml dvc.lock "$work/pulled/"
cp -a metrics "$work/pulled/"
cd "$work/pulled"
dvc pull
status=$(dvc status --with-deps evaluate)
echo "$status" >&2
[ "$status" = "Data and pipelines are up to date." ] || { echo "dvc status after pull: $status" >&2; exit 1; }
dvc repro evaluate >"$work/repro-pulled.log" 2>&1
if grep -q "^Running stage" "$work/repro-pulled.log"; then
    echo "dvc repro recomputed after the pull:" >&2
    cat "$work/repro-pulled.log" >&2
    exit 1
fi
outputs "$work/pulled" >"$work/pulled.md5"
diff "$work/made.md5" "$work/pulled.md5" >&2 || { echo "the pulled files differ" >&2; exit 1; }
echo "dvc push / pull: $(wc -l <"$work/pulled.md5") files pulled from the bucket, every stage up to date" >&2
