-- backbone-outbox 3.19.0: the statements backbone_outbox::outbox::migrate(pool, "zoo") runs
-- (src/outbox.rs:25-207, in its order), without the multi_tenant feature's RLS block (off here).
CREATE SCHEMA IF NOT EXISTS zoo;
CREATE TABLE IF NOT EXISTS zoo.outbox_events (
     id             uuid PRIMARY KEY,
     event_type     text NOT NULL,
     aggregate_type text NOT NULL,
     aggregate_id   text NOT NULL,
     company_id     uuid NOT NULL,
     payload        jsonb NOT NULL,
     occurred_at    timestamptz NOT NULL,
     correlation_id text,
     causation_id   text,
     version        int NOT NULL DEFAULT 1,
     created_at     timestamptz NOT NULL DEFAULT now(),
     published_at   timestamptz
);
ALTER TABLE zoo.outbox_events ADD COLUMN IF NOT EXISTS company_id uuid;
ALTER TABLE zoo.outbox_events ADD COLUMN IF NOT EXISTS failed_at timestamptz;
ALTER TABLE zoo.outbox_events ADD COLUMN IF NOT EXISTS failure_reason text;
ALTER TABLE zoo.outbox_events ADD COLUMN IF NOT EXISTS org_unit_id uuid;
UPDATE zoo.outbox_events SET org_unit_id = company_id
   WHERE org_unit_id IS NULL AND company_id IS NOT NULL;
CREATE OR REPLACE FUNCTION zoo.outbox_events_org_unit_fill() RETURNS trigger AS $$
   BEGIN
       IF NEW.org_unit_id IS NULL THEN
           NEW.org_unit_id := NULLIF(current_setting('app.acting_unit_id', true), '')::uuid;
       END IF;
       RETURN NEW;
   END;
   $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS outbox_events_org_unit_fill ON zoo.outbox_events;
CREATE TRIGGER outbox_events_org_unit_fill
   BEFORE INSERT ON zoo.outbox_events
   FOR EACH ROW EXECUTE FUNCTION zoo.outbox_events_org_unit_fill();
CREATE INDEX IF NOT EXISTS idx_zoo_outbox_pending
   ON zoo.outbox_events (occurred_at) WHERE published_at IS NULL AND failed_at IS NULL;
DROP INDEX IF EXISTS zoo.idx_zoo_outbox_unpublished;
CREATE TABLE IF NOT EXISTS zoo.inbox_consumed (
     consumer    text NOT NULL,
     event_id    uuid NOT NULL,
     consumed_at timestamptz NOT NULL DEFAULT now(),
     PRIMARY KEY (consumer, event_id)
);
