#!/usr/bin/env bash
# Builds capc:latest (every role) and capc-onnx:latest (a hospital with ONNX teachers,
# no torch) from the wheels in build/wheelhouse (`make images` builds them
# first), with the engine found by deploy/engine.sh. No registry is needed: without
# BASE_IMAGE the base is capc-base:bookworm, made once by deploy/make-base.sh and
# reused after. Prints each image's size.
#   BASE_IMAGE=python:3.11-slim deploy/build-images.sh   # a base the engine can pull
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=$(deploy/engine.sh)
export ENGINE
TAG=${CAPC_TAG:-latest}
if [ -z "${BASE_IMAGE:-}" ]; then
  BASE_IMAGE=capc-base:bookworm
  "$ENGINE" image inspect "$BASE_IMAGE" >/dev/null 2>&1 || deploy/make-base.sh "$BASE_IMAGE"
fi
for dir in build/wheelhouse/deps build/wheelhouse/capc; do
  ls "$dir"/*.whl >/dev/null 2>&1 || { echo "no wheels in $dir: run make images" >&2; exit 1; }
done
digest() { cat "$1"/*.whl | sha256sum | cut -d' ' -f1; }
deps=$(digest build/wheelhouse/deps)
capc=$(digest build/wheelhouse/capc)
# capc:TAG, every role (the Dockerfile's full stage); capc-onnx:TAG, a hospital with
# ONNX teachers, no torch (its onnx stage).
for stage in full onnx; do
  image=capc:$TAG
  [ "$stage" = onnx ] && image=capc-onnx:$TAG
  "$ENGINE" build --quiet --file deploy/Dockerfile --target "$stage" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg DEPS_SHA256="$deps" \
    --build-arg CAPC_SHA256="$capc" --tag "$image" . >/dev/null
  size=$("$ENGINE" image inspect --format '{{.Size}}' "$image")
  echo "$image: $((size / 1000000)) MB (base $BASE_IMAGE, $ENGINE)"
done
