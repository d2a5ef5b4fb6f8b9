//! The relays' SQL, as the article writes it: the fetch (with the filters a design adds), the
//! marks, the claim, what is pending, dead letters, and the watermarks.

/// The article's fetch: due, undelivered rows under the attempt limit, oldest first, locked so
/// that concurrent relays take different rows.
pub const FETCH_BATCH: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload
  FROM outbox
 WHERE published_at IS NULL
   AND next_attempt_at <= clock_timestamp()
   AND attempts < $1
 ORDER BY id
 LIMIT $2
 FOR UPDATE SKIP LOCKED";

/// The fence (`fence_standby`): where the WAL stands after the fetch, so past the commit of
/// every row it could see.
pub const FENCE_POSITION: &str = "SELECT pg_current_wal_lsn()::text";

/// The fence: every streaming standby has flushed the WAL up to the fetch's position. None
/// streaming (a promoted standby, alone): nothing to wait for, so a standby that disconnects
/// stops guarding; PostgreSQL 17's `synchronized_standby_slots` names them instead.
pub const STANDBYS_CONFIRMED: &str = "
SELECT COALESCE(bool_and(flush_lsn >= $1::text::pg_lsn), true)
  FROM pg_stat_replication WHERE state = 'streaming'";

/// The article's partitioning, added to the fetch: relay $3 of $4 takes only its aggregates.
/// The article writes `abs(hashtext(aggregate_id)) % $4`, but `abs()` of the one hash -2^31 is
/// out of integer range: while such a row is undelivered, every partitioned fetch that scans it
/// fails. Masking the sign bit keeps every non-negative hash's partition and gives each
/// negative one a partition just as fixed (not always abs()'s).
pub const PARTITION_FILTER: &str = "
   AND (hashtext(aggregate_id) & 2147483647) % $4 = $3";

/// The article's head-of-line guard, added to the fetch: no event overtakes an undelivered
/// earlier event of its aggregate (at the price of blocking the aggregate behind it). A dead
/// letter is undelivered too: it holds its aggregate's later events until it is requeued
/// (`outbox-lab requeue`), and then they go in order — order over availability, as the guard's
/// promise is order ([`PENDING_GUARDED`] does not wait for them).
pub const HEAD_OF_LINE_GUARD: &str = "
   AND NOT EXISTS (SELECT 1 FROM outbox o2
                    WHERE o2.aggregate_id = outbox.aggregate_id
                      AND o2.published_at IS NULL AND o2.id < outbox.id)";

/// The fetch of a relay: the article's statement with the filters its design adds before ORDER BY.
pub fn fetch_statement(partitioned: bool, guarded: bool) -> String {
    let (filters, order_and_lock) = FETCH_BATCH.split_at(
        FETCH_BATCH
            .find("\n ORDER BY")
            .expect("FETCH_BATCH has ORDER BY"),
    );
    let partition = if partitioned { PARTITION_FILTER } else { "" };
    let guard = if guarded { HEAD_OF_LINE_GUARD } else { "" };
    format!("{filters}{partition}{guard}{order_and_lock}")
}

/// One statement for the whole batch's deliveries.
pub const MARK_PUBLISHED: &str = "
UPDATE outbox
   SET published_at = clock_timestamp(), attempts = attempts + 1
 WHERE id = ANY($1)";

/// A failed delivery waits base * 2^(attempts so far): 200 ms, 400 ms, 800 ms, ..., at most
/// $4 ms, from now: the relay's $5 where its lease clock is its own, else the server's.
pub const MARK_FAILED: &str = "
UPDATE outbox
   SET attempts = attempts + 1,
       last_error = $2,
       next_attempt_at = COALESCE($5::timestamptz, clock_timestamp())
                         + LEAST($3::float8 * (2 ^ attempts), $4::float8) * interval '1 millisecond'
 WHERE id = $1";

/// [`MARK_FAILED`] for a row the lock design marked published beside its send, in the same open
/// transaction: unmarked again, its attempt already counted by that mark.
pub const UNMARK_FAILED: &str = "
UPDATE outbox
   SET published_at = NULL,
       last_error = $2,
       next_attempt_at = COALESCE($5::timestamptz, clock_timestamp())
                         + LEAST($3::float8 * (2 ^ (attempts - 1)), $4::float8)
                           * interval '1 millisecond'
 WHERE id = $1";

/// The rows a claim may take: due (on the server's clock), undelivered, and covered by no live
/// lease ($1 max attempts, $2 batch, $4 lease in ms, $5 the relay's now where its lease clock is
/// its own, else the server's); written once for [`CLAIM_BATCH`] and [`CLAIM_BATCH_FENCED`].
macro_rules! claimable_ids {
    () => {
        "
 WHERE id IN (SELECT id
                FROM outbox
               WHERE published_at IS NULL
                 AND next_attempt_at <= clock_timestamp()
                 AND attempts < $1
                 AND (claimed_at IS NULL
                      OR claimed_at < COALESCE($5::timestamptz, clock_timestamp())
                                      - $4::float8 * interval '1 millisecond')
               ORDER BY id
               LIMIT $2
                 FOR UPDATE SKIP LOCKED)"
    };
}

/// The claim design's fetch: due, undelivered rows that no live lease covers, claimed by this
/// relay in the same statement. It commits at once: no transaction stays open while delivering.
pub const CLAIM_BATCH: &str = concat!(
    "
UPDATE outbox
   SET claimed_at = COALESCE($5::timestamptz, clock_timestamp()), claimed_by = $3",
    claimable_ids!(),
    "
RETURNING id, event_id, aggregate_type, aggregate_id, event_type, payload"
);

/// The claim design's mark: only the rows whose lease this relay still holds.
pub const MARK_CLAIMED_PUBLISHED: &str = "
UPDATE outbox
   SET published_at = clock_timestamp(), attempts = attempts + 1
 WHERE id = ANY($1) AND claimed_by = $2";

/// The fenced claim (claim-lease-fenced): [`CLAIM_BATCH`], the claim taking one new fencing
/// token from a sequence for its whole batch; the token travels with each event.
pub const CLAIM_BATCH_FENCED: &str = concat!(
    "
WITH token AS (SELECT nextval('outbox_claim_token') AS token)
UPDATE outbox
   SET claimed_at = COALESCE($5::timestamptz, clock_timestamp()), claimed_by = $3,
       claim_token = (SELECT token FROM token)",
    claimable_ids!(),
    "
RETURNING id, event_id, aggregate_type, aggregate_id, event_type, payload, claim_token"
);

/// The fenced claim's mark: only rows still under the claim's token ($2), whoever re-claimed
/// them since.
pub const MARK_FENCED_PUBLISHED: &str = "
UPDATE outbox
   SET published_at = clock_timestamp(), attempts = attempts + 1
 WHERE id = ANY($1) AND claim_token = $2";

/// What is left to do: undelivered rows under the limit, and how long until the next is due.
pub const PENDING: &str = "
SELECT count(*),
       COALESCE(EXTRACT(EPOCH FROM min(next_attempt_at) - clock_timestamp()) * 1000, 0)::float8
  FROM outbox
 WHERE published_at IS NULL
   AND attempts < $1";

/// The same for a guarded relay: rows held behind a dead letter of their aggregate wait for
/// its requeue, not for the relay, which is drained without them.
pub const PENDING_GUARDED: &str = "
SELECT count(*),
       COALESCE(EXTRACT(EPOCH FROM min(next_attempt_at) - clock_timestamp()) * 1000, 0)::float8
  FROM outbox
 WHERE published_at IS NULL
   AND attempts < $1
   AND NOT EXISTS (SELECT 1 FROM outbox dead
                    WHERE dead.aggregate_id = outbox.aggregate_id
                      AND dead.published_at IS NULL AND dead.attempts >= $1
                      AND dead.id < outbox.id)";

/// What `/metrics` reports from the table: dead letters, and the age of the oldest row still
/// to deliver (how far the relays lag behind).
pub const BACKLOG: &str = "
SELECT count(*) FILTER (WHERE attempts >= $1) AS dead_letters,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp()
                - min(created_at) FILTER (WHERE attempts < $1)), 0)::float8
         AS oldest_unpublished_age_s
  FROM outbox
 WHERE published_at IS NULL";

/// Rows that used up their attempts: no relay fetches them again until they are requeued.
pub const DEAD_LETTERS: &str = "
SELECT id, attempts, last_error
  FROM outbox
 WHERE published_at IS NULL
   AND attempts >= $1
 ORDER BY id";

/// The article's way back from the dead letter, once the cause is fixed: only rows that used up
/// their attempts ($1, the relays' limit), so a row under retry keeps its backoff, and only rows
/// no relay holds right now (a locked row is skipped, not waited for).
pub const REQUEUE: &str = "
UPDATE outbox SET attempts = 0, next_attempt_at = clock_timestamp()
 WHERE id IN (SELECT id
                FROM outbox
               WHERE published_at IS NULL
                 AND attempts >= $1
                 FOR UPDATE SKIP LOCKED)";

/// Fetch "everything after the last id seen": the design that loses events.
pub const FETCH_AFTER_WATERMARK: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload
  FROM outbox
 WHERE id > $1
 ORDER BY id";

/// The same with a safety lag: only rows older than $2 ms, in the hope that every transaction
/// that took a smaller id has committed by then. A transaction slower than the lag is skipped
/// all the same.
pub const FETCH_AFTER_LAGGED_WATERMARK: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload
  FROM outbox
 WHERE id > $1
   AND created_at < clock_timestamp() - $2::float8 * interval '1 millisecond'
 ORDER BY id";

/// The gap-skipping watermark's fetch: the rows after the last id it got past, each saying
/// whether it is older than $2 ms. A gap before such a row is older still: its missing ids were
/// taken before the row's.
pub const FETCH_AFTER_WATERMARK_AGED: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload,
       created_at < clock_timestamp() - $2::float8 * interval '1 millisecond' AS stale
  FROM outbox
 WHERE id > $1
 ORDER BY id";

/// A gap-safe watermark: only rows whose writing transaction is older than every transaction
/// still running, in (transaction, id) order, after the last (transaction, id) delivered.
pub const FETCH_AFTER_XID_WATERMARK: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, xid::text AS xid
  FROM outbox
 WHERE (xid, id) > ($1::text::xid8, $2)
   AND xid < pg_snapshot_xmin(pg_current_snapshot())
 ORDER BY xid, id";

/// Where the stored watermark relay resumes: the highest id it has delivered.
pub const LOAD_WATERMARK: &str =
    "SELECT COALESCE(max(last_seen), 0) FROM relay_watermark WHERE relay = $1";

pub const SAVE_WATERMARK: &str = "
INSERT INTO relay_watermark(relay, last_seen) VALUES ($1, $2)
ON CONFLICT (relay) DO UPDATE SET last_seen = EXCLUDED.last_seen";

/// What the stored watermark relay has still to deliver: rows above its watermark. Rows below it
/// that committed late are not counted; nothing will ever deliver them.
pub const WATERMARK_PENDING: &str = "
SELECT count(*) FROM outbox
 WHERE id > COALESCE((SELECT max(last_seen) FROM relay_watermark WHERE relay = $1), 0)";

/// What a watermark relay over ids has still to deliver: rows above its watermark (a row that
/// committed below it is never counted again: nothing will deliver it).
pub const AFTER_WATERMARK: &str = "SELECT count(*) FROM outbox WHERE id > $1";

/// What the xid8 watermark relay has still to deliver: rows after its (transaction, id), visible
/// to it or not yet.
pub const AFTER_XID_WATERMARK: &str =
    "SELECT count(*) FROM outbox WHERE (xid, id) > ($1::text::xid8, $2)";
