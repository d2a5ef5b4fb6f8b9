#!/usr/bin/python3
"""The broken relay: it marks the batch published and COMMITs first, then sends. A failed
send is only logged, and a crash between the COMMIT and the last send leaves the rest of the
batch marked published but never delivered: at-most-once, events are lost.
"""

import sys

sys.dont_write_bytecode = True  # no __pycache__ next to the examples

import relay_common as common  # noqa: E402


def one_batch(conn, cursor, sink, args, stopping):
    rows = cursor.execute(common.FETCH, {"batch": args.batch}).fetchall()
    if rows:
        cursor.execute(common.MARK_PUBLISHED, {"ids": [row["id"] for row in rows]})
    conn.commit()  # from here on, the batch counts as delivered whatever happens
    lost = []
    for row in rows:
        try:
            sink.deliver(row)
        except common.DeliveryFailed as e:
            lost.append((row["id"], str(e)))
    if rows:
        line = (f"batch ids {rows[0]['id']}..{rows[-1]['id']}: marked published, "
                f"{len(rows) - len(lost)} sent, {len(lost)} failed and lost")
        if lost:
            line += f" (first failure id {lost[0][0]}: {lost[0][1]})"
        common.log(line)
    return len(rows)


if __name__ == "__main__":
    common.run(one_batch, "mark-before-send relay (mark published and commit, "
               "then send)", __doc__)
