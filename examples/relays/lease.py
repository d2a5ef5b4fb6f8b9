#!/usr/bin/python3
"""A lease-based relay with a table of its own, shaped like the outbox libraries people
install: it claims a batch by writing a lease (locked_by, locked_until) and COMMITs, delivers
the rows one by one, and marks each processed as soon as it is delivered. Nothing fences a
lease: a relay stalled past its lease (a GC pause, a frozen VM) goes on delivering rows that
another relay has claimed again meanwhile, and the events in flight are delivered twice.

With --hold-locks it is fenced by the database instead: the claim, the deliveries and the
marks are one transaction, whose row locks (FOR UPDATE SKIP LOCKED) keep every other relay
off the batch for as long as the relay lives, lease or not.

Its lease is kept on the database server's clock (clock_timestamp()), the same for every
relay. With --lease-clock relay it is kept on the relay's own wall clock instead (the time
passed in from the process), as libraries that compute `now + lease` in the application do:
a relay whose clock is ahead takes the others' leases for expired, and delivers what they are
delivering.

Its table is lease_outbox (lease_schema.sql); outbox-lab's writer fills it through
`verify --insert-sql` (see README.md), so that its message_id is outbox-lab's event id.
"""

import datetime
import sys

sys.dont_write_bytecode = True  # no __pycache__ next to the examples

import relay_common as common  # noqa: E402

# The claim: due rows whose lease is free or expired, in order, taken for --lease-ms; "now" is
# the server's clock, or (--lease-clock relay) the relay's, passed in.
CLAIM = """
UPDATE lease_outbox
   SET locked_by = %(me)s,
       locked_until = {now} + %(lease_ms)s * interval '1 millisecond'
 WHERE seq IN (SELECT seq FROM lease_outbox
                WHERE processed_at IS NULL
                  AND (locked_until IS NULL OR locked_until < {now})
                ORDER BY seq LIMIT %(batch)s
                  FOR UPDATE SKIP LOCKED)
RETURNING message_id AS event_id, aggregate_type, aggregate_id, event_type, payload, seq"""
NOW = {"db": "clock_timestamp()", "relay": "%(now)s"}

# Processed, whoever holds the lease now: no fencing token is compared.
MARK_PROCESSED = """
UPDATE lease_outbox SET processed_at = clock_timestamp() WHERE message_id = %(event_id)s"""


def one_batch(conn, cursor, sink, args, stopping):
    claim = CLAIM.format(now=NOW[args.lease_clock])
    now = datetime.datetime.now(datetime.timezone.utc)
    rows = sorted(cursor.execute(claim, {"me": args.name, "lease_ms": args.lease_ms,
                                         "batch": args.batch, "now": now}).fetchall(),
                  key=lambda row: row["seq"])
    if not args.hold_locks:
        conn.commit()  # the lease is all that keeps the others off these rows now
    delivered = 0
    for row in rows:
        if stopping.requested:
            break
        try:
            sink.deliver({k: v for k, v in row.items() if k != "seq"})
        except common.DeliveryFailed as e:
            common.log(f"seq {row['seq']}: {e}; the lease runs out and it is claimed again")
            break
        cursor.execute(MARK_PROCESSED, {"event_id": row["event_id"]})
        if not args.hold_locks:
            conn.commit()
        delivered += 1
    conn.commit()
    if rows:
        common.log(f"claimed seq {rows[0]['seq']}..{rows[-1]['seq']}: {delivered} delivered")
    return len(rows)


def options(parser):
    parser.add_argument("--lease-ms", type=int, default=1000,
                        help="how long a claim keeps the other relays off a row (default 1000)")
    parser.add_argument("--lease-clock", choices=sorted(NOW), default="db",
                        help="whose wall clock keeps the lease: the database server's (default) "
                             "or the relay's own")
    parser.add_argument("--hold-locks", action="store_true",
                        help="claim, deliver and mark in one transaction: its row locks fence "
                             "the batch for as long as the relay lives")


if __name__ == "__main__":
    common.run(one_batch, "lease relay (claim with a lease, deliver, mark each)", __doc__,
               options)
