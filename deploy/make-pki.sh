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
issue student student --dns student --dns student.capc.svc.cluster.local
issue gateway gateway
for h in hospital-a hospital-b hospital-c; do issue answerer "$h"; done
echo "certificates in $OUT/<service>/; the CA stays in $OUT/ca"
