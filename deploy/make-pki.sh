#!/usr/bin/env bash
# The consortium CA and one directory per service holding only ca.pem, the
# revocation list crl.pem and that service's own certificate and key (what
# docker-compose.yml mounts at /pki). Keep pki/ca/ (the CA key) offline once the
# certificates are issued. These are production certificates: valid only for the
# names given with --dns/--ip, never for localhost. deploy/revoke.sh revokes one.
set -euo pipefail
OUT=${1:-pki}
CAPC=${CAPC:-capc}
$CAPC pki init --dir "$OUT/ca"
issue() {  # role name [--dns NAME | --ip ADDRESS ...]
  local role=$1 name=$2; shift 2
  $CAPC pki issue --dir "$OUT/ca" --role "$role" --name "$name" "$@"
  mkdir -p "$OUT/$name"
  cp "$OUT/ca/ca.pem" "$OUT/ca/crl.pem" "$OUT/ca/$name.pem" "$OUT/ca/$name.key" "$OUT/$name/"
  chmod 0444 "$OUT/$name/"*.pem
  chmod 0440 "$OUT/$name/$name.key"
}
# The names the other services dial: the compose service and the Kubernetes service.
issue guardian guardian --dns guardian --dns guardian.capc.svc.cluster.local
# The guardian's Ed25519 key that signs its audit log (never stored in the ledger's database).
cp "$OUT/ca/guardian-audit.key" "$OUT/guardian/"
chmod 0440 "$OUT/guardian/guardian-audit.key"
issue student student --dns student --dns student.capc.svc.cluster.local
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
