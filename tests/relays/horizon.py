#!/usr/bin/python3
"""Relays that remember how far they got instead of marking rows, as offset-based relays do
(examples/relays' contract: --dsn, --sink, --batch, --mode, --interval-ms, --name). The mark
is stored in a table of the relay's own, in the transaction of each batch, so that a restart
resumes where it stopped (as production builds them).

  lag-watermark  delivers rows with id > its mark that are older than --lag-ms (the usual
                 "safety lag"), and moves the mark to the largest id it delivered: a
                 transaction that commits more than the lag after it took its ids is skipped
  gap-wait       delivers rows in id order, one id after the other: it waits at a missing id
                 for it to commit (a slow commit is delivered in order), and stalls for good
                 at an id that never commits (a rollback's)
  xid8           delivers rows in (writing transaction, id) order, only those whose writing
                 transaction is older than every transaction still running (the row's xmin
                 below the snapshot's xmin): it skips nothing, and waits behind any open
                 transaction of the server

Neither marks rows published: what it still owes is what is past its mark (--pending-sql,
PENDING below).
"""

import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "relays"))

import relay_common as common  # noqa: E402

MARKS = """
CREATE TABLE IF NOT EXISTS horizon_mark (
  relay text PRIMARY KEY, last_xid bigint NOT NULL, last_id bigint NOT NULL)"""

START = "INSERT INTO horizon_mark VALUES (%(relay)s, 0, 0) ON CONFLICT DO NOTHING"

LOAD = "SELECT last_xid, last_id FROM horizon_mark WHERE relay = %(relay)s"

SAVE = "UPDATE horizon_mark SET last_xid = %(xid)s, last_id = %(id)s WHERE relay = %(relay)s"

COLUMNS = "id, event_id, aggregate_type, aggregate_id, event_type, payload"

# The row's writing transaction as a number (32 bits, the epoch left out: a test's run stays in
# one), and the oldest transaction still running.
XMIN = "xmin::text::bigint"
HORIZON = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint % 4294967296"

FETCH = {
    "lag-watermark": f"""
SELECT {COLUMNS}, 0 AS xid FROM outbox
 WHERE id > %(id)s AND created_at < clock_timestamp() - %(lag_ms)s * interval '1 millisecond'
 ORDER BY id LIMIT %(batch)s""",
    "gap-wait": f"""
SELECT {COLUMNS}, 0 AS xid FROM outbox WHERE id > %(id)s ORDER BY id LIMIT %(batch)s""",
    "xid8": f"""
SELECT {COLUMNS}, {XMIN} AS xid FROM outbox
 WHERE ({XMIN}, id) > (%(xid)s, %(id)s) AND {XMIN} < %(horizon)s
 ORDER BY {XMIN}, id LIMIT %(batch)s""",
}


# What each still owes, by its own account (verify's --pending-sql).
PENDING = {
    "lag-watermark": "SELECT count(*) FROM outbox WHERE id > "
                     "(SELECT coalesce(max(last_id), 0) FROM horizon_mark)",
    "gap-wait": "SELECT count(*) FROM outbox WHERE id > "
                "(SELECT coalesce(max(last_id), 0) FROM horizon_mark)",
    "xid8": f"SELECT count(*) FROM outbox WHERE ({XMIN}, id) > "
            "(SELECT coalesce(max(last_xid), 0), coalesce(max(last_id), 0) FROM horizon_mark)",
}


def options(parser):
    parser.add_argument("--design", choices=sorted(FETCH), required=True)
    parser.add_argument("--lag-ms", type=int, default=200)


def main():
    made = set()

    def one_batch(conn, cursor, sink, args, stopping):
        if "marks" not in made:
            cursor.execute(MARKS)
            cursor.execute(START, {"relay": args.name})
            conn.commit()
            made.add("marks")
        cursor.execute(LOAD, {"relay": args.name})
        mark = cursor.fetchone()
        # The horizon in a statement of its own, before this transaction takes an xid.
        horizon = cursor.execute(f"SELECT {HORIZON} AS horizon").fetchone()["horizon"]
        rows = cursor.execute(FETCH[args.design], {
            "xid": mark["last_xid"], "id": mark["last_id"], "lag_ms": args.lag_ms,
            "batch": args.batch, "horizon": horizon}).fetchall()
        if args.design == "gap-wait":
            # Only the ids that follow the mark one after the other.
            expected, run = mark["last_id"] + 1, []
            for row in rows:
                if row["id"] != expected:
                    break
                run.append(row)
                expected += 1
            rows = run
        last = None
        for row in rows:
            try:
                sink.deliver(row)
            except common.DeliveryFailed as e:
                common.log(f"outbox id {row['id']} failed: {e}")
                break
            last = row
        if last is not None:
            cursor.execute(SAVE, {"relay": args.name, "xid": last["xid"], "id": last["id"]})
        conn.commit()
        return len(rows)

    common.run(one_batch, "a relay with a mark of its own", __doc__, options)


if __name__ == "__main__":
    main()
