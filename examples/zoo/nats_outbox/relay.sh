#!/bin/sh
# nats-outbox 0.1.0's own CLI relay, unmodified: `nats-outbox relay start --strategy polling`
# (PollingRelay: SELECT ... FOR UPDATE SKIP LOCKED, JetStream publish with Nats-Msg-Id =
# event_id, status in the same transaction). Ours: only the wiring of outbox-lab's addresses to
# the two settings it must have. Its other settings are its own OUTBOX_* variables, given on the
# relay command (`env OUTBOX_POLLING_INTERVAL=0.1 .../relay.sh`); unset, they keep its defaults.
#   OUTBOX_DATABASE_URL: outbox-lab's URL in the form SQLAlchemy's asyncpg dialect takes
#     (../zoo_db.py: asyncpg's own dsn, so the sessions keep application_name=relay-N)
#   OUTBOX_NATS_URL: outbox-lab's JetStream (OUTBOX_LAB_NATS_URL carries the token)
# SIGTERM: its CLI stops after the tick in flight, drains the NATS connection, exits 0.
here=$(cd "$(dirname "$0")" && pwd)
export OUTBOX_DATABASE_URL="$("$here/.venv/bin/python" "$here/../zoo_db.py")"
export OUTBOX_NATS_URL="$OUTBOX_LAB_NATS_URL"
exec "$here/.venv/bin/nats-outbox" relay start --strategy polling
