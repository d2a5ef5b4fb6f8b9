-- nats-outbox 0.1.0: DDL compiled from nats_outbox.core.models.OutboxEvent (SQLAlchemy, PostgreSQL dialect)
CREATE TABLE outbox_events (
	id BIGSERIAL NOT NULL, 
	event_id UUID NOT NULL, 
	subject TEXT NOT NULL, 
	headers JSONB NOT NULL, 
	payload JSONB NOT NULL, 
	status VARCHAR(20) NOT NULL, 
	retry_count SMALLINT NOT NULL, 
	last_error TEXT, 
	aggregate_id TEXT, 
	aggregate_type TEXT, 
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, 
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, 
	scheduled_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, 
	published_at TIMESTAMP WITH TIME ZONE, 
	PRIMARY KEY (id), 
	CONSTRAINT chk_outbox_status CHECK (status IN ('pending', 'published', 'failed')), 
	CONSTRAINT uq_outbox_event_id UNIQUE (event_id)
);
CREATE INDEX idx_outbox_aggregate ON outbox_events (aggregate_type, aggregate_id, id) WHERE status = 'pending';
CREATE INDEX idx_outbox_cleanup ON outbox_events (published_at) WHERE status = 'published';
CREATE INDEX idx_outbox_pending ON outbox_events (scheduled_at, id) WHERE status = 'pending';
