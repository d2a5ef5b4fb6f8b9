//! The test suite, against real servers: one test binary of one module per file, so that the
//! suite links once, shares one PostgreSQL cluster (`common::server_url`) and runs its tests
//! side by side whichever file they are in (separate binaries run one after another).

mod common;

mod bad_input;
mod cdc;
mod clean;
mod clocks;
mod delivery;
mod docs;
mod explore;
mod guest;
mod invariants;
mod kafka;
mod lifecycle;
mod masked_urls;
mod nats;
mod nemeses;
mod pg_link;
mod pipes;
mod processes;
mod rabbitmq;
mod relay_sql;
mod report;
mod scenarios;
mod secrets;
mod setup;
mod standalone;
mod storage;
mod strangers;
mod transactions;
mod verify;
mod verify_bad_input;
mod zoo;
