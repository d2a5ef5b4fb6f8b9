//! The links between the actors and their servers, as proxies on the wire that do to the
//! traffic what real networks do, each beside its siblings with one watch contract: [`http`]
//! (a relay to the HTTP consumer: latency, resets, lost replies, as [`faults`] plans them),
//! [`resp`] (a relay to Redis),
//! [`postgres`] (a relay or the writer to its database: which backends are whose, a reset, a
//! partition, a COMMIT whose answer is lost), [`kafka`] (the private Kafka broker's only way in,
//! SASL PLAIN at its door), [`kafka_proxy`] (a relay to Kafka: its Produce requests, with the same [`faults`]), and
//! [`watch`], the deliveries the nemeses wait for and how a proxy that sees one pass holds it
//! while they strike.

pub mod faults;
pub mod http;
pub mod kafka;
pub mod kafka_proxy;
pub mod postgres;
pub mod resp;
pub mod watch;
