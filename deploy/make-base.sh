#!/usr/bin/env bash
# A Debian base image made with no container registry: debootstrap builds a minimal
# bookworm root filesystem from Debian's own packages (python3.11 and its venv module
# included, so the capc build needs no package download), and the engine imports it.
#   deploy/make-base.sh [IMAGE]          # default capc-base:bookworm
# ENGINE (docker or podman; found when unset) and DEBIAN_MIRROR may be set. Needs root
# (debootstrap) and about a minute.
set -euo pipefail
IMAGE=${1:-capc-base:bookworm}
ENGINE=${ENGINE:-$(deploy/engine.sh)}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || {
  echo "debootstrap is not installed: apt-get install debootstrap, or name a base image with python3.11 (BASE_IMAGE=...)" >&2
  exit 1
}
root=$(mktemp -d "${TMPDIR:-/tmp}/capc-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# What an image never reads: package lists and caches, documentation, manual pages,
# the programs' message translations (33 MB; the services speak English).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*/
tar -C "$root" -c . | "$ENGINE" import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null 2>&1
echo "$IMAGE: Debian bookworm (debootstrap, $MIRROR)"
