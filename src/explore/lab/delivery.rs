//! Where the relays deliver, and so which consumer of ours reads it: our HTTP consumer, a
//! Redis consumer group, a JetStream durable consumer, a RabbitMQ queue, a Kafka topic; each
//! made empty before a run, and what a broker still holds for the consumer (a run is not
//! drained before that).

use anyhow::{anyhow, Result};
use rskafka::client::partition::PartitionClient;
use tokio::sync::mpsc;

use super::Lab;
use crate::harness::child::role::{
    AmqpWorkerRole, ConsumerRole, JetStreamWorkerRole, KafkaWorkerRole, Role as ChildRole,
    StreamWorkerRole,
};
use crate::harness::child::ChildCommand;
use crate::harness::link::faults::{FaultRecord, ProxyFaults};
use crate::harness::link::http::Proxy;
use crate::harness::link::kafka_proxy::KafkaProxy;
use crate::harness::link::resp::RedisProxy;
use crate::harness::link::watch::{DeliveryWatch, WatchedDelivery};
use crate::outbox::consumer::Faults;
use crate::outbox::crash::CrashPlan;
use crate::outbox::sink::{AmqpSink, KafkaSink, NatsSink, PARTITIONS};
use crate::outbox::stream_consumer;
use crate::outbox::{jetstream_consumer, kafka_consumer};

/// Where the relays deliver, and so which consumer runs.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// POSTs to our HTTP consumer.
    Http,
    /// XADDs to `stream` on the Redis at `url`, read by a consumer-group worker of ours.
    Redis { url: String, stream: String },
    /// Publishes to `outbox.event.<aggregate_type>` on the NATS at `url`, captured by the
    /// stream [`JETSTREAM_STREAM`] and read by a durable pull consumer of ours.
    Nats { url: String },
    /// Publishes to the durable queue `queue` on the RabbitMQ at `url`, read by a worker of
    /// ours with manual acks.
    Amqp { url: String, queue: String },
    /// Produces to the topic `topic` on the Kafka at `url`, read by a worker of ours that
    /// records its offsets in the consumer's database.
    Kafka { url: String, topic: String },
}

/// The JetStream stream a run's deliveries go to (made anew for every run).
pub(super) const JETSTREAM_STREAM: &str = "outbox";
/// The Redis consumer's worker name, the same in every process: a restarted worker takes
/// over its predecessor's pending entries.
const STREAM_WORKER: &str = "verify-worker";
/// Entries a stream worker reads at a time.
const STREAM_READ_COUNT: usize = 100;

/// What a broker holds that our consumer has not acknowledged: a worker killed with messages
/// in hand has them delivered again only after the ack wait, so a quiet consumer is not yet a
/// drained one.
pub(super) enum Backlog {
    /// Nothing waits elsewhere: our HTTP consumer applies every delivery before answering
    /// it, and a Redis worker takes over its predecessor's pending entries as it starts.
    Nothing,
    /// The durable consumer's messages not yet delivered, and delivered but not acked.
    Nats {
        url: String,
        consumer: Option<Box<async_nats::jetstream::consumer::PullConsumer>>,
    },
    /// The queue's messages ready for our worker (one it took and did not ack goes back when
    /// its channel closes: a killed worker's come back at once).
    Amqp {
        url: String,
        queue: String,
        channel: Option<lapin::Channel>,
    },
    /// The topic's records past the offsets our worker recorded, read through a client per
    /// partition kept from one count to the next (made anew after a failed one).
    Kafka {
        url: String,
        topic: String,
        partitions: Option<Vec<PartitionClient>>,
    },
}

impl Backlog {
    pub(super) fn new(delivery: &Delivery) -> Backlog {
        match delivery {
            Delivery::Http | Delivery::Redis { .. } => Backlog::Nothing,
            Delivery::Nats { url } => Backlog::Nats {
                url: url.clone(),
                consumer: None,
            },
            Delivery::Amqp { url, queue } => Backlog::Amqp {
                url: url.clone(),
                queue: queue.clone(),
                channel: None,
            },
            Delivery::Kafka { url, topic } => Backlog::Kafka {
                url: url.clone(),
                topic: topic.clone(),
                partitions: None,
            },
        }
    }

    /// How many messages wait for our consumer; `receipts` reaches the consumer's database.
    pub(super) async fn count(&mut self, receipts: &tokio_postgres::Client) -> Result<i64> {
        if let Backlog::Kafka {
            url,
            topic,
            partitions,
        } = self
        {
            if partitions.is_none() {
                let client = crate::connect::kafka(url).await?;
                *partitions = Some(KafkaSink::partition_clients(&client, topic).await?);
            }
            let read = kafka_consumer::offsets(receipts, topic).await?;
            let counted = KafkaSink::records_past(partitions.as_deref().unwrap_or_default(), &read);
            let counted = counted.await;
            if counted.is_err() {
                *partitions = None;
            }
            return counted;
        }
        if let Backlog::Amqp {
            url,
            queue,
            channel,
        } = self
        {
            if !channel.as_ref().is_some_and(|c| c.status().connected()) {
                *channel = Some(crate::connect::amqp(url).await?.create_channel().await?);
            }
            let channel = channel.as_ref().expect("opened above");
            return AmqpSink::ready_messages(channel, queue).await;
        }
        let Backlog::Nats { url, consumer } = self else {
            return Ok(0);
        };
        if consumer.is_none() {
            let jetstream = async_nats::jetstream::new(crate::connect::nats(url).await?);
            let stream = jetstream
                .get_stream(JETSTREAM_STREAM)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            // Not there until the first worker created it: nothing is drained before that.
            *consumer = Some(Box::new(
                stream
                    .get_consumer(jetstream_consumer::DURABLE)
                    .await
                    .map_err(|e| anyhow!("{e}"))?,
            ));
        }
        let info = consumer
            .as_mut()
            .expect("set above")
            .info()
            .await
            .map_err(|e| anyhow!("{e}"))?;
        Ok((info.num_pending + info.num_ack_pending as u64) as i64)
    }
}

impl Delivery {
    /// Empty before a run: the stream and its group, the queue, the JetStream stream.
    pub(super) async fn make_empty(&self) -> Result<()> {
        match self {
            Delivery::Http => {}
            Delivery::Redis { url, stream } => {
                // An empty stream and its consumer group, which the first worker joins.
                let mut redis = crate::connect::redis(url).await?;
                let _: i64 = redis::AsyncCommands::del(&mut redis, stream).await?;
                let _: () = redis::AsyncCommands::xgroup_create_mkstream(
                    &mut redis,
                    stream,
                    stream_consumer::GROUP,
                    "0",
                )
                .await?;
            }
            Delivery::Amqp { url, queue } => {
                // An empty durable queue.
                let connection = crate::connect::amqp(url).await?;
                let channel = connection.create_channel().await?;
                AmqpSink::redeclare_queue(&channel, queue).await?;
                let _ = connection.close(200, "declared".into()).await;
            }
            Delivery::Kafka { url, topic } => {
                // An empty topic (its partitions keep a key's records in order).
                let client = crate::connect::kafka(url).await?;
                KafkaSink::create_fresh_topic(&client, topic, PARTITIONS).await?;
            }
            Delivery::Nats { url } => {
                // An empty stream capturing every aggregate type's subject; the worker creates
                // its durable consumer.
                let jetstream = async_nats::jetstream::new(crate::connect::nats(url).await?);
                let config = NatsSink::stream_config(JETSTREAM_STREAM, "");
                NatsSink::create_fresh_stream(&jetstream, config).await?;
            }
        }
        Ok(())
    }
}

/// What stands between the relays and where they deliver, when the schedule strikes on the
/// way: the fault proxy in front of our HTTP consumer, the Redis proxy in front of Redis, the
/// Kafka proxy in front of Kafka.
pub(super) enum Middle {
    Http(Proxy),
    Redis(RedisProxy),
    Kafka(KafkaProxy),
}

impl Middle {
    /// Where relay `index` sends through it.
    pub(super) fn relay_url(&self, index: u32) -> String {
        match self {
            Middle::Http(proxy) => proxy.relay_url(index).to_string(),
            Middle::Redis(proxy) => proxy.relay_url(index).to_string(),
            Middle::Kafka(proxy) => proxy.relay_url(index).to_string(),
        }
    }

    /// The HTTP proxy, whose common way in is the consumer's URL for every other sender.
    pub(super) fn http(&self) -> Option<&Proxy> {
        match self {
            Middle::Http(proxy) => Some(proxy),
            Middle::Redis(_) | Middle::Kafka(_) => None,
        }
    }

    /// What the proxy that does the network faults (HTTP's, Kafka's) did.
    pub(super) fn record(&self) -> Option<&FaultRecord> {
        match self {
            Middle::Http(proxy) => Some(proxy.record()),
            Middle::Kafka(proxy) => Some(proxy.record()),
            Middle::Redis(_) => None,
        }
    }
}

impl Lab<'_> {
    /// With no fault on the way, a proxy all the same where the relays could not reach the
    /// sink otherwise: the private Redis' socket is its server's, and a relay running as
    /// another user ([`RunAs`](crate::harness::run_as::RunAs)) goes through a proxy that
    /// watches nothing.
    pub(super) fn let_relays_in(
        &self,
        tell: mpsc::UnboundedSender<WatchedDelivery>,
    ) -> Result<Option<Middle>> {
        match (self.delivery(), self.relay_user()) {
            (Delivery::Redis { url, .. }, Some(user)) => {
                let watch = DeliveryWatch::new(Vec::new(), tell);
                let proxy = RedisProxy::start(&url, watch, self.design.relays, Some(user))?;
                Ok(Some(Middle::Redis(proxy)))
            }
            _ => Ok(None),
        }
    }

    /// The proxy that does `faults` to the relays' deliveries, in front of where they go.
    pub(super) async fn stand_between(&self, faults: ProxyFaults) -> Result<Middle> {
        let relays = self.design.relays;
        match (self.delivery(), faults.watch.clone()) {
            (Delivery::Http, _) => Ok(Middle::Http(
                Proxy::start(&self.sink_url(), faults, relays).await?,
            )),
            (Delivery::Redis { url, .. }, Some(watch)) if faults.plans.is_empty() => Ok(
                Middle::Redis(RedisProxy::start(&url, watch, relays, self.relay_user())?),
            ),
            (Delivery::Kafka { url, .. }, _) => Ok(Middle::Kafka(
                KafkaProxy::start(&url, faults, relays).await?,
            )),
            // verify's plan refuses them before a run.
            (delivery, _) => Err(anyhow!(
                "no proxy for these faults in front of {delivery:?}"
            )),
        }
    }

    /// Where the relays deliver: our HTTP consumer, or the broker.
    pub(super) fn sink_url(&self) -> String {
        match self.delivery() {
            Delivery::Http => format!("http://127.0.0.1:{}", self.port),
            Delivery::Redis { url, .. }
            | Delivery::Nats { url }
            | Delivery::Amqp { url, .. }
            | Delivery::Kafka { url, .. } => url,
        }
    }

    /// The HTTP consumer on the lab's port, a Redis consumer-group worker or a JetStream worker.
    pub(super) fn consumer_command(&self, plan: Option<CrashPlan>) -> ChildCommand<ChildRole> {
        let command = match self.delivery() {
            Delivery::Http => ChildCommand::new(
                &self.consumer_db,
                ConsumerRole {
                    kind: self.design.consumer,
                    port: self.port,
                    faults: Faults {
                        fail_every_delivery_of: self.design.poison_without_dead_letter,
                        ..Faults::default()
                    },
                },
            )
            .any_role(),
            Delivery::Redis { url, stream } => ChildCommand::new(
                &self.consumer_db,
                StreamWorkerRole {
                    redis_url: url,
                    stream,
                    worker: STREAM_WORKER.into(),
                    kind: self.design.consumer,
                    count: STREAM_READ_COUNT,
                    follow: true,
                },
            )
            .any_role(),
            Delivery::Nats { url } => ChildCommand::new(
                &self.consumer_db,
                JetStreamWorkerRole {
                    nats_url: url,
                    stream: JETSTREAM_STREAM.into(),
                    durable: jetstream_consumer::DURABLE.into(),
                    kind: self.design.consumer,
                    batch: STREAM_READ_COUNT,
                    follow: true,
                },
            )
            .any_role(),
            Delivery::Amqp { url, queue } => ChildCommand::new(
                &self.consumer_db,
                AmqpWorkerRole {
                    amqp_url: url,
                    queue,
                    kind: self.design.consumer,
                    batch: STREAM_READ_COUNT,
                },
            )
            .any_role(),
            Delivery::Kafka { url, topic } => ChildCommand::new(
                &self.consumer_db,
                KafkaWorkerRole {
                    kafka_url: url,
                    topic,
                    kind: self.design.consumer,
                    batch: STREAM_READ_COUNT,
                    follow: true,
                },
            )
            .any_role(),
        };
        command.crash_at(plan)
    }
}
