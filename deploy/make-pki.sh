#!/usr/bin/env bash
# The consortium CA and one directory per service holding only ca.pem and that
# service's own certificate and key (what docker-compose.yml mounts at /pki).
# Keep pki/ca/ (the CA key) offline once the certificates are issued.
set -euo pipefail
OUT=${1:-pki}
CAPC=${CAPC:-capc}
$CAPC pki init --dir "$OUT/ca"
issue() {  # role name [host...]
  local role=$1 name=$2; shift 2
  local hosts=()
  for h in "$@"; do hosts+=(--host "$h"); done
  $CAPC pki issue --dir "$OUT/ca" --role "$role" --name "$name" "${hosts[@]}"
  mkdir -p "$OUT/$name"
  cp "$OUT/ca/ca.pem" "$OUT/ca/$name.pem" "$OUT/ca/$name.key" "$OUT/$name/"
  chmod 0444 "$OUT/$name/"*.pem
  chmod 0440 "$OUT/$name/$name.key"
}
issue guardian guardian guardian localhost
issue student student student localhost
issue gateway gateway
for h in hospital-a hospital-b hospital-c; do issue answerer "$h"; done
echo "certificates in $OUT/<service>/; the CA stays in $OUT/ca"
