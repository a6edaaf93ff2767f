#!/usr/bin/env bash
# Revoke a certificate made by make-pki.sh and hand the new crl.pem to every
# service directory. Running services reload it on their next call, without a
# restart (a bind mount or a Secret update brings the file into the container).
#   deploy/revoke.sh hospital-b [key-compromise] [pki]
set -euo pipefail
NAME=${1:?usage: deploy/revoke.sh NAME [REASON] [PKI_DIR]}
REASON=${2:-unspecified}
OUT=${3:-pki}
CAPC=${CAPC:-capc}
$CAPC pki revoke --dir "$OUT/ca" "$NAME" --reason "$REASON"
for dir in "$OUT"/*/; do
  [ "$dir" = "$OUT/ca/" ] && continue
  # install replaces the file (a new inode), so a reader never sees half of it
  install -m 0444 "$OUT/ca/crl.pem" "$dir/crl.pem"
done
echo "crl.pem copied to every service directory under $OUT/"
