#!/usr/bin/env bash
# The Secrets deploy/k8s's workloads mount, made for `podman kube play` from the
# directories deploy/make-pki.sh wrote: NAME-pki from PKI/NAME for the guardian, the
# student, the gateway and the three hospitals (on a cluster: kubectl create secret
# generic, consortium.yaml). Podman keeps each as a Kubernetes Secret document, which is
# what its kube play reads for a secret volume.
#   deploy/k8s/podman-secrets.sh [PKI]        # default pki; NAMES="guardian ..." to choose
# Podman 4.3 (Debian bookworm's) writes a Secret's data into the files as it is in the
# document, without decoding base64, so for it the values are the files themselves
# (PEM text); later podman decodes base64 as Kubernetes does, and gets base64.
set -euo pipefail
PKI=${1:-pki}
NAMES=${NAMES:-guardian student gateway hospital-a hospital-b hospital-c}
version=$(podman version --format '{{.Client.Version}}')
case $version in
  4.[0-3].*) verbatim=1 ;;
  *) verbatim=0 ;;
esac
for name in $NAMES; do
  dir=$PKI/$name
  [ -d "$dir" ] || { echo "no directory $dir: run deploy/make-pki.sh first" >&2; exit 1; }
  {
    printf 'apiVersion: v1\nkind: Secret\nmetadata: {name: %s-pki}\ntype: Opaque\ndata:\n' "$name"
    for file in "$dir"/*; do
      if [ "$verbatim" = 1 ]; then
        printf '  %s: |\n' "$(basename "$file")"
        sed 's/^/    /' "$file"
      else
        printf '  %s: %s\n' "$(basename "$file")" "$(base64 -w0 "$file")"
      fi
    done
  } | podman secret create "$name-pki" - >/dev/null
  echo "podman secret $name-pki: $dir"
done
