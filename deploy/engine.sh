#!/usr/bin/env bash
# Prints the container engine to use: $ENGINE when set, else docker when its daemon
# answers, else podman. Fails, saying what to install, when there is neither.
set -euo pipefail
if [ -n "${ENGINE:-}" ]; then echo "$ENGINE"; exit 0; fi
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker; exit 0; fi
if command -v podman >/dev/null; then echo podman; exit 0; fi
echo "no container engine: install Docker, or podman (apt-get install podman runc)" >&2
exit 1
