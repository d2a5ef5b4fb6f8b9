//! Where batch-throughput's cells deliver: a sink's database and the server behind it (none for
//! the ceiling, the HTTP consumer, a Redis stream, a JetStream stream, a RabbitMQ queue, a Kafka
//! topic), emptied
//! before each run and asked afterwards how many events it received.

use anyhow::{anyhow, Result};
use lapin::options::QueuePurgeOptions;
use redis::AsyncCommands;
use tokio_postgres::Client;

use super::{Ctx, SinkKind};
use crate::connect;
use crate::harness::child::ConsumerProcess;
use crate::harness::db::Database;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::sink::{AmqpSink, KafkaSink, NatsSink, RedisSink, DISCARD_URL, PARTITIONS};

/// Where the cells of one sink deliver: its database (reset before every run), its URL and
/// what counts the deliveries.
pub(super) struct Target {
    pub(super) db: Database,
    pub(super) client: Client,
    pub(super) url: String,
    receiver: Receiver,
}

/// What receives a sink's events, and counts them after a run.
enum Receiver {
    /// Nothing (the ceiling): every event the relay marked published is one the sink took.
    Nowhere,
    /// The HTTP consumer, up for every run; it counts in the target's database.
    Consumer(ConsumerProcess),
    /// A Redis Stream, cleared before every run.
    Redis {
        connection: redis::aio::MultiplexedConnection,
        stream: String,
    },
    /// A JetStream stream capturing the run's subjects, purged before every run and deleted
    /// at the end.
    Nats {
        jetstream: async_nats::jetstream::Context,
        stream: String,
    },
    /// A durable RabbitMQ queue, purged before every run.
    Amqp {
        channel: lapin::Channel,
        queue: String,
    },
    /// A Kafka topic, made anew before every run.
    Kafka {
        client: rskafka::client::Client,
        topic: String,
    },
}

impl Target {
    /// The database and the server behind `sink`'s cells (and those of its [`SinkKind::server`]).
    pub(super) async fn start(ctx: &Ctx<'_>, sink: SinkKind) -> Result<Target> {
        let db = ctx.database(sink.server().name()).await?;
        let client = db.connect().await?;
        let (url, receiver) = match sink.server() {
            SinkKind::DbOnly => (DISCARD_URL.to_string(), Receiver::Nowhere),
            SinkKind::Redis => {
                let url = ctx.redis_url().await?;
                let connection = connect::redis(&url).await?;
                let stream = RedisSink::stream_name(ctx.redis_key_prefix(), "orders");
                (url, Receiver::Redis { connection, stream })
            }
            SinkKind::Nats => {
                let url = ctx.nats_url().await?;
                let jetstream = async_nats::jetstream::new(connect::nats(&url).await?);
                let stream = format!("{}outbox_throughput", ctx.nats_name_prefix());
                // In memory, as the private Redis keeps its stream (no persistence): both sinks
                // are measured on what the relay and the broker do per event, not on the
                // broker's disk (a file stream measured 0.46-0.53 of the ceiling here, a memory
                // one 0.53-0.59). The durability scenarios keep file streams.
                let config = async_nats::jetstream::stream::Config {
                    storage: async_nats::jetstream::stream::StorageType::Memory,
                    ..NatsSink::stream_config(&stream, ctx.nats_subject_prefix())
                };
                NatsSink::create_fresh_stream(&jetstream, config).await?;
                (url, Receiver::Nats { jetstream, stream })
            }
            SinkKind::Amqp => {
                let url = ctx.amqp().url().await?;
                let queue = ctx
                    .amqp()
                    .declare_queue(&AmqpSink::queue_name("", "orders"))
                    .await?;
                let channel = connect::amqp(&url).await?.create_channel().await?;
                (url, Receiver::Amqp { channel, queue })
            }
            SinkKind::Kafka => {
                let url = ctx.kafka().url().await?;
                let topic = ctx
                    .kafka()
                    .create_topic(&KafkaSink::topic_name("", "orders"), PARTITIONS)
                    .await?;
                let client = connect::kafka(&url).await?;
                (url, Receiver::Kafka { client, topic })
            }
            SinkKind::Http | SinkKind::HttpArray => {
                let consumer = ctx
                    .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
                    .await?;
                (consumer.url.clone(), Receiver::Consumer(consumer))
            }
        };
        Ok(Target {
            db,
            client,
            url,
            receiver,
        })
    }

    /// Nothing received yet: the stream emptied (the consumer's tables go with the schema).
    pub(super) async fn clear(&mut self) -> Result<()> {
        match &mut self.receiver {
            Receiver::Nowhere | Receiver::Consumer(_) => {}
            Receiver::Redis { connection, stream } => {
                let _: i64 = connection.del(&*stream).await?;
            }
            Receiver::Nats { jetstream, stream } => {
                jetstream
                    .get_stream(&*stream)
                    .await
                    .map_err(|e| anyhow!("JetStream stream {stream}: {e}"))?
                    .purge()
                    .await
                    .map_err(|e| anyhow!("cannot purge JetStream stream {stream}: {e}"))?;
            }
            Receiver::Amqp { channel, queue } => {
                channel
                    .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                    .await
                    .map_err(|e| anyhow!("cannot purge queue {queue}: {e}"))?;
            }
            Receiver::Kafka { client, topic } => {
                KafkaSink::create_fresh_topic(client, topic, PARTITIONS).await?;
            }
        }
        Ok(())
    }

    /// What the sink received since [`Target::clear`].
    pub(super) async fn delivered(&mut self) -> Result<i64> {
        Ok(match &mut self.receiver {
            Receiver::Nowhere => counts::count(&self.client, counts::PUBLISHED).await?,
            Receiver::Consumer(_) => counts::count(&self.client, counts::RECEIVED).await?,
            Receiver::Redis { connection, stream } => connection.xlen(&*stream).await?,
            Receiver::Nats { jetstream, stream } => {
                let info = jetstream
                    .get_stream(&*stream)
                    .await
                    .map_err(|e| anyhow!("JetStream stream {stream}: {e}"))?
                    .info()
                    .await
                    .map_err(|e| anyhow!("cannot read JetStream stream {stream}: {e}"))?
                    .clone();
                info.state.messages as i64
            }
            Receiver::Amqp { channel, queue } => AmqpSink::ready_messages(channel, queue).await?,
            Receiver::Kafka { client, topic } => {
                let partitions = KafkaSink::partition_clients(client, topic).await?;
                KafkaSink::records_past(&partitions, &Default::default()).await?
            }
        })
    }

    pub(super) async fn stop(self) -> Result<()> {
        match self.receiver {
            Receiver::Consumer(consumer) => consumer.stop().await,
            // The queue and the topic are the run's (deleted with an external broker's at the
            // end).
            Receiver::Nowhere
            | Receiver::Redis { .. }
            | Receiver::Amqp { .. }
            | Receiver::Kafka { .. } => Ok(()),
            Receiver::Nats { jetstream, stream } => {
                jetstream
                    .delete_stream(&stream)
                    .await
                    .map_err(|e| anyhow!("cannot delete JetStream stream {stream}: {e}"))?;
                Ok(())
            }
        }
    }
}
