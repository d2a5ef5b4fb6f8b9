-- event-forge 1.5.0: DDL compiled from event_forge.repositories.sqlalchemy.entities.OutboxMessageEntity
CREATE TABLE outbox_messages (
	id VARCHAR(36) NOT NULL, 
	aggregate_type VARCHAR(255) NOT NULL, 
	aggregate_id VARCHAR(255) NOT NULL, 
	event_type VARCHAR(255) NOT NULL, 
	payload JSON NOT NULL, 
	metadata JSON, 
	status VARCHAR(50) NOT NULL, 
	retry_count INTEGER NOT NULL, 
	max_retries INTEGER NOT NULL, 
	error_message TEXT, 
	scheduled_at TIMESTAMP WITH TIME ZONE, 
	locked_by VARCHAR(255), 
	locked_at TIMESTAMP WITH TIME ZONE, 
	created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	PRIMARY KEY (id)
);
CREATE INDEX idx_outbox_created ON outbox_messages (created_at);
CREATE INDEX idx_outbox_locked_by ON outbox_messages (locked_by);
CREATE INDEX idx_outbox_status_scheduled ON outbox_messages (status, scheduled_at);
