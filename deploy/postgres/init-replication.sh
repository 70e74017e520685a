#!/bin/bash
# Runs once, when the primary's data directory is first created (mounted into /docker-entrypoint-initdb.d):
# a role that may stream WAL, the physical replication slot the postgres-replica service streams from (the primary
# keeps the WAL it has not received, up to max_slot_wal_keep_size), and the pg_hba.conf line that admits it.
set -euo pipefail
psql -v ON_ERROR_STOP=1 -v password="${REPLICATION_PASSWORD:-replicator}" --username "$POSTGRES_USER" \
     --dbname "$POSTGRES_DB" <<'EOSQL'
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'password';
SELECT pg_create_physical_replication_slot('replica_1');
EOSQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
