#!/bin/sh
# nats-outbox 0.1.0's own CLI relay, unmodified: `nats-outbox relay start` (PollingRelay, JetStream publish).
# It wants OUTBOX_DATABASE_URL as postgresql+asyncpg://... and OUTBOX_NATS_URL. ../zoo_db.py rewrites
# outbox-lab's URL for SQLAlchemy's asyncpg dialect (socket dir as ?host=, application_name dropped:
# the CLI builds its own engine, so its sessions carry no relay-N name).
here=$(dirname "$0"); py="$here/../../venvs/nats-outbox/bin/python"
export OUTBOX_DATABASE_URL="$("$py" "$here/../zoo_db.py")"
export OUTBOX_NATS_URL="${OUTBOX_LAB_NATS_URL:-nats://127.0.0.1:4222}"
export OUTBOX_POLLING_INTERVAL="${OUTBOX_POLLING_INTERVAL:-0.1}" OUTBOX_BATCH_SIZE="${OUTBOX_BATCH_SIZE:-50}"
exec "$here/../../venvs/nats-outbox/bin/nats-outbox" relay start --strategy polling
