-- nodii-outbox-dispatcher 0.6.0: get_outbox_dispatcher_migration_sql(outbox_table="outbox_nodii")
-- nodii-outbox-dispatcher — producer-side outbox table.
--
-- Schema tracks 09-replication-doctrine § 2.2. One outbox per producing
-- service. D401: NO publish-side DLQ table — failures stay in the outbox +
-- the 24h-unpublished sweep alerts.

-- ── 1. outbox_nodii ──────────────────────────────
CREATE TABLE IF NOT EXISTS "outbox_nodii" (
  id                     TEXT        PRIMARY KEY,
  event_id               TEXT        NOT NULL,
  aggregate_kind         TEXT        NOT NULL,
  aggregate_id           TEXT        NOT NULL,
  source_entity_version  BIGINT      NOT NULL,
  topic                  TEXT        NOT NULL,
  event_class            TEXT        NOT NULL DEFAULT 'fact',
  payload                JSONB       NOT NULL,
  telemetry_envelope     JSONB       NULL,
  occurred_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
  dispatched_at          TIMESTAMPTZ NULL,
  stream_id              TEXT        NULL,
  publish_attempts       INT         NOT NULL DEFAULT 0,
  last_error             TEXT        NULL,
  last_attempt_at        TIMESTAMPTZ NULL,
  -- D43 trace-propagation columns (D281). All NULLable / best-effort: the
  -- dispatcher claim SELECTs them and carries them across the hop as dedicated
  -- envelope slots; a NULL never affects correctness (D25 backstop).
  request_id             TEXT        NULL,
  intent_id              TEXT        NULL,
  trace_parent           TEXT        NULL,
  trace_state            TEXT        NULL
);

ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS telemetry_envelope JSONB NULL;
-- 09-replication v22 § 2.1/§ 2.3: mandatory Pattern-3 event class. DEFAULT 'fact'
-- backfills every existing row + makes producer INSERTs that omit the column safe.
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS event_class TEXT NOT NULL DEFAULT 'fact';
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS dispatched_at TIMESTAMPTZ NULL;
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS stream_id TEXT NULL;
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS publish_attempts INT NOT NULL DEFAULT 0;
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS last_error TEXT NULL;
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS last_attempt_at TIMESTAMPTZ NULL;
-- D43 trace columns — forward-compat backfill onto an EXISTING outbox (D281).
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS request_id TEXT NULL;
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS intent_id TEXT NULL;
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS trace_parent TEXT NULL;
ALTER TABLE "outbox_nodii" ADD COLUMN IF NOT EXISTS trace_state TEXT NULL;

CREATE INDEX IF NOT EXISTS idx_outbox_nodii_pending
  ON "outbox_nodii" (occurred_at)
  WHERE dispatched_at IS NULL;

