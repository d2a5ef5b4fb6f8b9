-- faststream-outbox 0.19.0: make_outbox_table(MetaData(), table_name="outbox_fs"), compiled for PostgreSQL
CREATE TABLE outbox_fs (
	id BIGSERIAL NOT NULL, 
	queue VARCHAR(255) NOT NULL, 
	payload BYTEA NOT NULL, 
	headers JSONB, 
	attempts_count BIGINT DEFAULT '0' NOT NULL, 
	deliveries_count BIGINT DEFAULT '0' NOT NULL, 
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, 
	next_attempt_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, 
	first_attempt_at TIMESTAMP WITH TIME ZONE, 
	last_attempt_at TIMESTAMP WITH TIME ZONE, 
	acquired_at TIMESTAMP WITH TIME ZONE, 
	acquired_token UUID, 
	timer_id VARCHAR(255), 
	PRIMARY KEY (id), 
	CONSTRAINT outbox_fs_lease_ck CHECK ((acquired_token IS NULL) = (acquired_at IS NULL))
);
CREATE INDEX outbox_fs_leased_idx ON outbox_fs (queue, next_attempt_at, id) WHERE acquired_token IS NOT NULL;
CREATE INDEX outbox_fs_pending_idx ON outbox_fs (queue, next_attempt_at, id) WHERE acquired_token IS NULL;
CREATE UNIQUE INDEX outbox_fs_timer_id_uq ON outbox_fs (queue, timer_id) WHERE timer_id IS NOT NULL;
-- Not part of the library: its broker.publish() calls pg_notify('outbox_<table>', queue) itself;
-- a foreign writer's plain INSERT does not, so this trigger gives the same wake-up.
CREATE OR REPLACE FUNCTION outbox_fs_notify() RETURNS trigger AS $$
BEGIN PERFORM pg_notify('outbox_outbox_fs', NEW.queue); RETURN NEW; END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER outbox_fs_notify AFTER INSERT ON outbox_fs FOR EACH ROW EXECUTE FUNCTION outbox_fs_notify();
