-- pactix 0.2.0: DDL compiled from pactix.db.tables.outbox_message (PostgreSQL dialect)
CREATE TABLE outbox_message (
	id UUID NOT NULL, 
	message_id TEXT NOT NULL, 
	event_type TEXT NOT NULL, 
	message_key TEXT, 
	ordering_key TEXT, 
	correlation_id TEXT, 
	payload JSONB NOT NULL, 
	headers JSONB DEFAULT '{}'::jsonb NOT NULL, 
	status TEXT NOT NULL, 
	attempts INTEGER DEFAULT 0 NOT NULL, 
	max_attempts INTEGER NOT NULL, 
	available_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	lease_until TIMESTAMP WITH TIME ZONE, 
	last_error TEXT, 
	created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	published_at TIMESTAMP WITH TIME ZONE, 
	PRIMARY KEY (id), 
	CONSTRAINT outbox_message_status_check CHECK (status IN ('pending', 'processing', 'published', 'failed')), 
	UNIQUE (message_id)
);
CREATE INDEX idx_outbox_message_correlation ON outbox_message (correlation_id) WHERE correlation_id IS NOT NULL;
CREATE INDEX idx_outbox_message_fifo ON outbox_message (event_type, ordering_key, created_at) WHERE ordering_key IS NOT NULL;
CREATE INDEX idx_outbox_message_lease ON outbox_message (lease_until) WHERE status = 'processing';
CREATE INDEX idx_outbox_message_ready ON outbox_message (status, available_at) WHERE status = 'pending';
-- pactix migration 0003_add_outbox_wake_trigger (for NotifyMode.TRIGGER):
CREATE OR REPLACE FUNCTION outbox_wake() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('outbox_wake', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER outbox_message_wake AFTER INSERT ON outbox_message FOR EACH ROW EXECUTE FUNCTION outbox_wake();
