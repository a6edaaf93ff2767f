#!/bin/sh
# Runs once, when PostgreSQL initialises an empty data directory (the postgres image runs
# /docker-entrypoint-initdb.d/*.sh; docker-compose.yml and deploy/k8s mount this file there).
#
# The guardian's ledger and the gateway's token store get a role and a database each, and
# neither role may connect to the other's database: the querier-side gateway can never
# read or write the privacy ledger. The superuser (POSTGRES_USER) is used by no service.
set -eu
: "${LEDGER_DB_PASSWORD:?set LEDGER_DB_PASSWORD (the guardian's ledger role)}"
: "${GATEWAY_DB_PASSWORD:?set GATEWAY_DB_PASSWORD (the gateway's token-store role)}"
LEDGER_ROLE=${LEDGER_ROLE:-capc_ledger}
GATEWAY_ROLE=${GATEWAY_ROLE:-capc_gateway}
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v ledger="$LEDGER_ROLE" -v ledger_pw="$LEDGER_DB_PASSWORD" \
  -v gateway="$GATEWAY_ROLE" -v gateway_pw="$GATEWAY_DB_PASSWORD" <<'SQL'
CREATE ROLE :"ledger" LOGIN PASSWORD :'ledger_pw';
CREATE ROLE :"gateway" LOGIN PASSWORD :'gateway_pw';
CREATE DATABASE :"ledger" OWNER :"ledger";
CREATE DATABASE :"gateway" OWNER :"gateway";
REVOKE ALL ON DATABASE :"ledger" FROM PUBLIC;
REVOKE ALL ON DATABASE :"gateway" FROM PUBLIC;
SQL
