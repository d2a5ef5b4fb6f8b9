//! The system under test: the article's outbox [`schema`], the [`event`] that travels, the
//! [`writer`] (business transaction + outbox row), the [`relay`] (fetch, deliver through a
//! [`sink`], mark published), the HTTP [`consumer`], the Redis [`stream_consumer`] and the
//! JetStream [`jetstream_consumer`], RabbitMQ [`amqp_consumer`] and Kafka [`kafka_consumer`]
//! ones, and the
//! named [`crash`] points where they die; [`phases`]: the moments they print, on request, for
//! notify-latency's split of a delivery's time.

pub mod amqp_consumer;
pub mod consumer;
pub mod crash;
pub mod event;
pub mod jetstream_consumer;
pub mod kafka_consumer;
pub mod phases;
pub mod relay;
pub mod schema;
pub mod sink;
pub mod stream_consumer;
pub mod writer;
