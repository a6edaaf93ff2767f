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
# The gateway's HTTPS certificate: the names analysts reach it by (CAPC_GATEWAY_HOSTS,
# space-separated) and "gateway", its name inside compose and Kubernetes (the
# healthcheck verifies that one). Without CAPC_GATEWAY_HOSTS it is a development
# certificate for localhost, which is refused otherwise.
https_hosts=(--host gateway)
if [ -n "${CAPC_GATEWAY_HOSTS:-}" ]; then
  for h in $CAPC_GATEWAY_HOSTS; do https_hosts+=(--host "$h"); done
else
  echo "CAPC_GATEWAY_HOSTS unset: the gateway's HTTPS certificate names only localhost (development)" >&2
  https_hosts+=(--host localhost --host 127.0.0.1 --dev)
fi
$CAPC pki issue-https --dir "$OUT/ca" --name gateway "${https_hosts[@]}"
cp "$OUT/ca/gateway-https.pem" "$OUT/ca/gateway-https.key" "$OUT/gateway/"
chmod 0444 "$OUT/gateway/gateway-https.pem"
chmod 0440 "$OUT/gateway/gateway-https.key"
for h in hospital-a hospital-b hospital-c; do issue answerer "$h"; done
echo "certificates in $OUT/<service>/; the CA stays in $OUT/ca"
