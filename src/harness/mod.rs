//! The harness: everything that sets the stage for the system under test and watches it — the
//! throwaway PostgreSQL [`cluster`] (and a [`replicated`] pair, primary and streaming standby,
//! for failover), the run's message [`brokers`]: [`redis_server`], [`nats_server`], [`rabbitmq_server`] and [`kafka_server`]
//! (on free [`ports`], in [`throwaway`] directories, the private Kafka in a [`netns`] of its
//! own; the last four [`on_demand`]: the user's or a private one started on first use), the
//! [`db`] server and databases of a run, the [`run`]'s life around them (its id, Ctrl-C), [`child`]
//! processes that die for real, a [`foreign`] relay (the user's command, [`run_as`] an
//! unprivileged user when we are root), each leading a
//! [`process_group`] that goes with it, a [`process`] told apart from another of the same pid, the [`link`]s between the actors and their servers
//! (proxies on the wire: HTTP and RESP to the sink, PostgreSQL's to the database, with the
//! faults they do and the deliveries they watch), the
//! [`nemesis`] machinery (signals to our own children, backends terminated), bulk [`load`]ing
//! with COPY.

pub mod brokers;
pub mod child;
pub mod clock;
pub mod cluster;
pub mod db;
pub mod foreign;
pub mod kafka_server;
pub mod link;
pub mod load;
pub mod nats_server;
pub mod nemesis;
pub mod netns;
pub mod on_demand;
pub mod ports;
pub mod process;
pub mod process_group;
pub mod rabbitmq_server;
pub mod redis_server;
pub mod replicated;
pub mod roles;
pub mod run;
pub mod run_as;
pub mod server;
pub mod throwaway;
