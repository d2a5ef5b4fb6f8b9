-- lease.py's own table, as an outbox library brings one: its message id, the event, and the
-- lease (who claimed the row, until when). outbox-lab's writer fills it with `verify
-- --insert-sql` (see README.md).
CREATE TABLE lease_outbox (
  seq            bigserial   PRIMARY KEY,
  message_id     uuid        NOT NULL UNIQUE,
  aggregate_type text        NOT NULL,
  aggregate_id   text        NOT NULL,
  event_type     text        NOT NULL,
  payload        jsonb       NOT NULL,
  locked_by      text,
  locked_until   timestamptz,
  processed_at   timestamptz
);
CREATE INDEX lease_outbox_due_idx ON lease_outbox (seq) WHERE processed_at IS NULL;
