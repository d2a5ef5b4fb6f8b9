#!/usr/bin/python3
"""The article's relay: per batch, in ONE transaction, lock due rows (FOR UPDATE SKIP LOCKED),
deliver them in id order, then mark the delivered ones published and COMMIT. A failed
delivery is retried later with a backoff (200 ms * 2^attempts, at most 5 attempts), and the
rest of the batch for the same aggregate waits for a later batch. At-least-once: a crash
after sending and before COMMIT sends those events again (the consumer dedups by event_id);
no event is ever marked published without having been delivered.
"""

import sys

sys.dont_write_bytecode = True  # no __pycache__ next to the examples

import relay_common as common  # noqa: E402

MARK_FAILED = """
UPDATE outbox
   SET attempts = attempts + 1,
       next_attempt_at = clock_timestamp() + interval '200 milliseconds' * 2 ^ attempts,
       last_error = %(error)s
 WHERE id = %(id)s"""


def one_batch(conn, cursor, sink, args, stopping):
    rows = cursor.execute(common.FETCH, {"batch": args.batch}).fetchall()
    delivered, failed, blocked, held = [], [], set(), 0
    for row in rows:
        if stopping.requested:
            break  # asked to stop: commit what was delivered, leave the rest to the next run
        if row["aggregate_id"] in blocked:
            held += 1  # an earlier event of this aggregate failed: keep them in order
            continue
        try:
            sink.deliver(row)
            delivered.append(row["id"])
        except common.DeliveryFailed as e:
            failed.append((row["id"], str(e)))
            blocked.add(row["aggregate_id"])
    if delivered:
        done = common.DELETE_PUBLISHED if args.delete_published else common.MARK_PUBLISHED
        cursor.execute(done, {"ids": delivered})
    for outbox_id, error in failed:
        cursor.execute(MARK_FAILED, {"id": outbox_id, "error": error})
    conn.commit()
    if rows:
        line = (f"batch ids {rows[0]['id']}..{rows[-1]['id']}: {len(delivered)} delivered, "
                f"{len(failed)} failed, {held} held back")
        if failed:
            line += f" (first failure id {failed[0][0]}: {failed[0][1]})"
        common.log(line)
    return len(rows)


if __name__ == "__main__":
    common.run(one_batch, "article relay (deliver, then mark published, one "
               "transaction)", __doc__)
