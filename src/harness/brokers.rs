//! The message brokers of a run — Redis, NATS, RabbitMQ, Kafka — each the user's (a `--*-url`)
//! or a private one started when a scenario or a verification first asks for it, and all ended
//! together at the run's end (this run's names deleted from the user's, the private ones
//! stopped).

use anyhow::Result;

use crate::harness::kafka_server::Kafka;
use crate::harness::nats_server::Nats;
use crate::harness::rabbitmq_server::Amqp;
use crate::harness::redis_server::Redis;

/// The brokers the user named (`--redis-url`, …); None: a private one on demand.
#[derive(Debug, Clone, Copy, Default)]
pub struct BrokerUrls<'a> {
    pub redis: Option<&'a str>,
    pub nats: Option<&'a str>,
    pub amqp: Option<&'a str>,
    pub kafka: Option<&'a str>,
}

/// A run's brokers.
pub struct Brokers {
    pub redis: Redis,
    pub nats: Nats,
    pub amqp: Amqp,
    pub kafka: Kafka,
}

impl Brokers {
    /// Nothing starts yet: each on first use. `keep`: the private ones left running (and this
    /// run's names on the user's), as `--keep` says.
    pub fn new(urls: BrokerUrls, run_id: &str, keep: bool) -> Brokers {
        Brokers {
            redis: Redis::new(urls.redis, run_id, keep),
            nats: Nats::new(urls.nats, run_id, keep),
            amqp: Amqp::new(urls.amqp, run_id, keep),
            kafka: Kafka::new(urls.kafka, run_id, keep),
        }
    }

    /// Ends the run on every broker, each whatever the others did; the first failure.
    pub async fn close(self) -> Result<()> {
        let closed = [
            self.redis.close().await,
            self.nats.close().await,
            self.amqp.close().await,
            self.kafka.close().await,
        ];
        closed.into_iter().collect()
    }
}
