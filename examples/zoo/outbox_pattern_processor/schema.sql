-- outbox-pattern-processor 0.4.0: the tables and indexes its documentation requires, as the
-- project ships them (database/migrations/1_outbox_pattern_table.sql and database/README.md,
-- "Required table" / "Required indexes", of github.com/deroldo/outbox-pattern-processor; the crate
-- itself ships no DDL). One change: the tables go into the schema zoo_opp, because outbox-lab's
-- own schema already has a table `outbox`; the library's SQL names them unqualified, and the relay's
-- sessions reach them by search_path (src/main.rs).
CREATE SCHEMA IF NOT EXISTS zoo_opp;

create table zoo_opp.outbox
(
    idempotent_key   uuid        not null,
    partition_key    uuid        not null,
    destinations     jsonb       not null,
    headers          jsonb,
    payload          text        not null,
    attempts         int         not null default 0,
    created_at       timestamptz not null default now(),
    process_after    timestamptz not null default now(),
    processed_at     timestamptz,
    primary key (idempotent_key)
);

create index idx_outbox_by_partition_key on zoo_opp.outbox (partition_key);
create index idx_outbox_by_process_after on zoo_opp.outbox (process_after);
create index idx_outbox_by_processed_at on zoo_opp.outbox (processed_at);
create index idx_outbox_by_partition_key_and_process_after on zoo_opp.outbox (partition_key, process_after);
create index idx_outbox_by_part_key_and_proc_after_and_attempt_and_proc_at on zoo_opp.outbox (partition_key, process_after, attempts) where processed_at is null;

create table zoo_opp.outbox_lock
(
    partition_key    uuid        not null,
    lock_id          uuid        not null,
    processed_at     timestamptz,
    processing_until timestamptz not null default now() + ('30 seconds')::interval
);

create unique index unq_outbox_lock_by_partition_key on zoo_opp.outbox_lock (partition_key) where processed_at is null;
create index idx_outbox_lock_by_lock_id on zoo_opp.outbox_lock (lock_id);
create index idx_outbox_lock_by_processing_until on zoo_opp.outbox_lock (processing_until) where processed_at is null;
create index idx_outbox_lock_by_processed_at on zoo_opp.outbox_lock (processed_at);
create index idx_outbox_by_partition_key_and_processing_until on zoo_opp.outbox_lock (partition_key, processing_until);

create table zoo_opp.outbox_cleaner_schedule
(
    cron_expression varchar(50) not null,
    last_execution timestamptz not null default now()
);
