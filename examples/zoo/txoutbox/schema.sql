-- txoutbox 0.2.2: PostgresStorage(table="outbox_tx", notify_channel="outbox_tx_new").schema_sql()
CREATE TABLE IF NOT EXISTS outbox_tx (
    id          BIGSERIAL   PRIMARY KEY,
    topic       TEXT        NOT NULL,
    key         TEXT,
    payload     BYTEA       NOT NULL,
    headers     JSONB       NOT NULL DEFAULT '{}',
    status      TEXT        NOT NULL DEFAULT 'pending',
    attempts    INT         NOT NULL DEFAULT 0,
    retry_at    TIMESTAMPTZ,
    leased_by   TEXT,
    lease_until TIMESTAMPTZ,
    last_error  TEXT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS outbox_tx_pending_idx ON outbox_tx (id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS outbox_tx_key_pending_idx ON outbox_tx (key, id) WHERE status = 'pending';
CREATE OR REPLACE FUNCTION outbox_tx_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('outbox_tx_new', NEW.id::text);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS outbox_tx_notify ON outbox_tx;
CREATE TRIGGER outbox_tx_notify AFTER INSERT ON outbox_tx
    FOR EACH ROW EXECUTE FUNCTION outbox_tx_notify();
