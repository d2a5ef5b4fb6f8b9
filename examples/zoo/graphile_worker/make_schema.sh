#!/bin/sh
# Prints the DDL graphile-worker 0.17.3 installs itself: its own migrations (sql/000001-000019.sql,
# run by `graphile-worker --schema-only`, dist/migrate.js) applied to an empty scratch database,
# then dumped with pg_dump (the migrations table's rows included, so that run() finds the schema
# up to date and migrates nothing). The dump's session settings are left out, but for
# check_function_bodies = false (its SQL functions name tables created after them).
# Usage, from this folder after `npm ci`: ./make_schema.sh 'postgres:///scratch?host=/var/run/postgresql' > schema.sql
set -eu
url=$1
node node_modules/graphile-worker/dist/cli.js --connection "$url" --schema-only >&2
echo '-- graphile-worker 0.17.3: its migrations (graphile-worker --schema-only), dumped by pg_dump --inserts (make_schema.sh)'
pg_dump -d "$url" -n graphile_worker --no-owner --no-privileges --inserts --no-comments |
  grep -v -E '^(SET [^c]|SELECT pg_catalog.set_config|--$|-- Dumped|-- PostgreSQL database dump|\\(un)?restrict )' | cat -s
# The rows add_job would create on its first call for the task 'outbox' and for each of the 16
# named queues the zoo's insert uses ('orders-0' ... 'orders-15'; insert ... on conflict do
# nothing, in add_job). Created here, because verify's writer holds two overlapping
# transactions in one process: add_job's insert of a queue name (or task) not yet committed
# makes the other session wait for the first one's commit, which that writer only sends after
# the second has finished: the writer would wait on itself. On a running system these rows exist
# after the first job of each queue.
echo "INSERT INTO graphile_worker._private_tasks (identifier) VALUES ('outbox');"
echo "INSERT INTO graphile_worker._private_job_queues (queue_name) SELECT 'orders-' || g FROM generate_series(0, 15) g;"
# The supervisor's record of each relay's pools (relay.js: the documented recovery unlocks a dead
# pool's jobs when its relay starts again). Here, not in relay.js: two relays starting at once
# would race on CREATE TABLE IF NOT EXISTS, and one would die of a duplicate pg_type row.
echo "CREATE TABLE public.zoo_supervisor_pools (relay text NOT NULL, pool_id text NOT NULL);"
