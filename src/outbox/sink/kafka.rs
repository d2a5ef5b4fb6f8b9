//! The Kafka sink: each event a record of the topic `outbox.event.<aggregate_type>` (which must
//! exist), keyed by its aggregate id, so that one aggregate's events go to one partition and
//! stay in order there (the partition chosen as Kafka's own clients choose it for a key:
//! murmur2), the event as JSON its value and its id in an `event_id` header too; a batch's
//! records produced a partition at a time, each partition's records in one request, every
//! request awaiting acks from all in-sync replicas (`acks=all`).
//!
//! rskafka has no idempotent producer: a Produce retried after its answer was lost may write
//! the records twice, as any producer without `enable.idempotence` may. The relay retries a
//! failed event itself, in the next batch.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use futures_util::StreamExt;
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::record::Record;

use super::{topic, SinkOptions};
use crate::connect;
use crate::outbox::event::Event;

/// Partitions of every topic outbox-lab makes: an aggregate's events stay in one (the record
/// key is the aggregate id), in order; three let different aggregates' go side by side.
pub const PARTITIONS: i32 = 3;
/// The most bytes one fetch takes from a partition (rskafka's answer to a fetch is whole
/// record batches up to this).
pub const FETCH_MAX_BYTES: i32 = 4 * 1024 * 1024;
/// How long a fetch waits for a first record before it answers empty (tansu answers a fetch
/// that may not wait with no topic at all, which rskafka refuses).
pub const FETCH_WAIT_MS: i32 = 10;
/// How long a topic's creation or deletion may take.
const TOPIC_TIMEOUT_MS: i32 = 5_000;

/// The header that carries the event id (the value carries it too).
pub const EVENT_ID_HEADER: &str = "event_id";

/// Produces events to Kafka, a topic per aggregate type (after the run's prefix).
#[derive(Clone)]
pub struct KafkaSink {
    client: Arc<rskafka::client::Client>,
    /// Each topic's partitions, looked up on first use.
    partitions: Arc<tokio::sync::Mutex<HashMap<String, Arc<Vec<PartitionClient>>>>>,
    /// Before every topic name (the run's name prefix on an external cluster).
    topic_prefix: String,
    /// Records per Produce request (0: a partition's share of a batch in one).
    records_per_request: usize,
    /// Produce requests in flight at once per partition.
    in_flight: usize,
    /// A partition's request unanswered in this time failed (its records may still be written),
    /// and its topic's connections are dropped: Kafka's own producers disconnect on a request
    /// timeout, for a connection that answers nothing may answer nothing more.
    request_timeout: Duration,
}

impl KafkaSink {
    /// The topic of an aggregate type, named as Debezium's outbox router names it.
    pub fn topic_name(prefix: &str, aggregate_type: &str) -> String {
        topic(prefix, aggregate_type)
    }

    /// Connected to the cluster `options` names: a wrong URL or password is an error at once,
    /// not a retried event.
    pub(super) async fn connect(options: &SinkOptions, request_timeout: Duration) -> Result<Self> {
        Ok(KafkaSink {
            client: Arc::new(connect::kafka(&options.url).await?),
            partitions: Arc::default(),
            topic_prefix: options.stream_prefix.clone(),
            records_per_request: options.records_per_request,
            in_flight: options.in_flight,
            request_timeout,
        })
    }

    /// The topic `name` made anew, empty, with `partitions` partitions ([`PARTITIONS`] unless
    /// an experiment needs all in one): an earlier one is deleted first (with what it held).
    pub async fn create_fresh_topic(
        client: &rskafka::client::Client,
        name: &str,
        partitions: i32,
    ) -> Result<()> {
        let controller = client.controller_client()?;
        if client.list_topics().await?.iter().any(|t| t.name == name) {
            controller
                .delete_topic(name, TOPIC_TIMEOUT_MS)
                .await
                .with_context(|| format!("cannot delete Kafka topic {name}"))?;
        }
        controller
            .create_topic(name, partitions, 1, TOPIC_TIMEOUT_MS)
            .await
            .with_context(|| format!("cannot create Kafka topic {name}"))?;
        Ok(())
    }

    /// How many partitions topic `name` has (an error if there is no such topic).
    pub async fn partition_count(client: &rskafka::client::Client, name: &str) -> Result<i32> {
        let topic = client
            .list_topics()
            .await?
            .into_iter()
            .find(|t| t.name == name);
        let topic = topic.ok_or_else(|| anyhow!("no Kafka topic {name}"))?;
        Ok(topic.partitions.len() as i32)
    }

    /// A client for each partition of topic `name`, in order (each keeps a connection to its
    /// partition's leader: keep them to read the topic again).
    pub async fn partition_clients(
        client: &rskafka::client::Client,
        name: &str,
    ) -> Result<Vec<PartitionClient>> {
        let mut clients = Vec::new();
        for partition in 0..Self::partition_count(client, name).await? {
            clients.push(
                client
                    .partition_client(name, partition, UnknownTopicHandling::Error)
                    .await
                    .with_context(|| format!("Kafka topic {name}, partition {partition}"))?,
            );
        }
        Ok(clients)
    }

    /// How many records topic `name` holds from the offsets `from` on (a partition it does not
    /// name: from its start), read through its `partitions` ([`Self::partition_clients`]).
    /// Read, not asked: tansu's ListOffsets answered 993 for the 1,000 records its partitions
    /// held.
    pub async fn records_past(
        partitions: &[PartitionClient],
        from: &HashMap<i32, i64>,
    ) -> Result<i64> {
        let mut records = 0;
        Self::read_past(partitions, from, |_, _| records += 1).await?;
        Ok(records)
    }

    /// Every record a topic holds from the offsets `from` on (a partition it does not name: from
    /// its start), read through its `partitions` ([`Self::partition_clients`]), to `visit` with
    /// its partition: partition by partition, each in the order of its offsets (the order a
    /// consumer reads it in).
    pub async fn read_past(
        partitions: &[PartitionClient],
        from: &HashMap<i32, i64>,
        mut visit: impl FnMut(i32, &Record),
    ) -> Result<()> {
        for reader in partitions {
            let (name, partition) = (reader.topic(), reader.partition());
            let mut offset = from.get(&partition).copied().unwrap_or(0);
            loop {
                let (read, _) = reader
                    .fetch_records(offset, 1..FETCH_MAX_BYTES, FETCH_WAIT_MS)
                    .await
                    .with_context(|| format!("cannot read Kafka topic {name}"))?;
                let Some(last) = read.last().map(|r| r.offset) else {
                    break;
                };
                for read in read.iter().filter(|r| r.offset >= offset) {
                    visit(partition, &read.record);
                }
                offset = last + 1;
            }
        }
        Ok(())
    }

    /// The partitions of topic `name`, in order, looked up once.
    async fn partitions_of(&self, name: &str) -> Result<Arc<Vec<PartitionClient>>> {
        let mut known = self.partitions.lock().await;
        if let Some(partitions) = known.get(name) {
            return Ok(partitions.clone());
        }
        let clients = Self::partition_clients(&self.client, name).await?;
        let clients = Arc::new(clients);
        known.insert(name.to_string(), clients.clone());
        Ok(clients)
    }

    /// One Produce request of `records` to `partition` of topic `name`, acknowledged within the
    /// request timeout; after a timeout the topic's connections are dropped.
    async fn produce(
        &self,
        name: &str,
        partition: usize,
        client: &PartitionClient,
        records: Vec<Record>,
    ) -> Result<()> {
        let request = client.produce(records, Compression::NoCompression);
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(answered) => answered
                .map(drop)
                .with_context(|| format!("Kafka produce to {name}, partition {partition}")),
            Err(_) => {
                self.partitions.lock().await.remove(name);
                Err(anyhow!(
                    "no answer from Kafka within {:?}",
                    self.request_timeout
                ))
            }
        }
    }

    /// Every partition's records produced at once, each partition's in one request (in batch
    /// order: a key's records keep their order), or in requests of `records_per_request`,
    /// `in_flight` of them at once per partition; an event is delivered if and only if its
    /// request was acknowledged within the request timeout. With one request in flight, those
    /// after a failed one are not sent (they fail with it); with more, they are already on
    /// their way, and a request retried after them lands behind them: a key's order breaks, as
    /// with Kafka's `max.in.flight.requests.per.connection` above 1 without idempotence.
    pub(super) async fn deliver(
        &self,
        events: &[Event],
        on_delivered: impl Fn(&Event),
    ) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = events
            .iter()
            .map(|_| Err(anyhow!("not produced")))
            .collect();
        // (topic, partition) -> its partitions' clients and the batch positions of its events,
        // in order.
        type Group = (Arc<Vec<PartitionClient>>, Vec<usize>);
        let mut groups: BTreeMap<(String, usize), Group> = BTreeMap::new();
        for (position, event) in events.iter().enumerate() {
            let name = Self::topic_name(&self.topic_prefix, &event.aggregate_type);
            match self.partitions_of(&name).await {
                Ok(partitions) => {
                    let partition =
                        partition_for_key(event.aggregate_id.as_bytes(), partitions.len());
                    let group = groups.entry((name, partition));
                    group
                        .or_insert_with(|| (partitions, Vec::new()))
                        .1
                        .push(position);
                }
                Err(e) => results[position] = Err(e),
            }
        }
        let produced = futures_util::future::join_all(groups.into_iter().map(
            |((name, partition), (partitions, positions))| async move {
                let requests = match self.records_per_request {
                    0 => vec![positions],
                    n => positions.chunks(n).map(<[usize]>::to_vec).collect(),
                };
                let client = &partitions[partition];
                let name = &name;
                let mut answered =
                    futures_util::stream::iter(requests.into_iter().map(|positions| async move {
                        let records = positions.iter().map(|&p| record(&events[p])).collect();
                        let outcome = self.produce(name, partition, client, records).await;
                        (positions, outcome)
                    }))
                    .buffered(self.in_flight.max(1));
                let mut outcomes = Vec::new();
                while let Some((positions, outcome)) = answered.next().await {
                    let failed = outcome.is_err();
                    outcomes.push((positions, outcome));
                    // One request at a time: what follows a failed one waits for the next
                    // batch, behind it.
                    if failed && self.in_flight <= 1 {
                        break;
                    }
                }
                outcomes
            },
        ))
        .await;
        for (positions, outcome) in produced.into_iter().flatten() {
            for position in positions {
                results[position] = match &outcome {
                    Ok(()) => Ok(()),
                    Err(e) => Err(anyhow!("{e:#}")),
                };
            }
        }
        for (event, result) in events.iter().zip(&results) {
            if result.is_ok() {
                on_delivered(event);
            }
        }
        results
    }
}

/// An event as a record: its aggregate id the key, the event as JSON the value, its id in a
/// header.
fn record(event: &Event) -> Record {
    Record {
        key: Some(event.aggregate_id.clone().into_bytes()),
        // An event always serializes.
        value: Some(serde_json::to_vec(event).unwrap_or_default()),
        headers: BTreeMap::from([(
            EVENT_ID_HEADER.to_string(),
            event.event_id.to_string().into_bytes(),
        )]),
        timestamp: chrono::Utc::now(),
    }
}

/// The partition Kafka's own clients (the Java client's default partitioner, librdkafka's
/// `murmur2_random`) choose for a keyed record: murmur2 of the key, its sign bit cleared,
/// modulo the partitions. Other producers of the same keys land where ours do.
pub fn partition_for_key(key: &[u8], partitions: usize) -> usize {
    (murmur2(key) & 0x7fff_ffff) as usize % partitions.max(1)
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`, seed 0x9747b28c).
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own figures (the Java client's UtilsTest.testMurmur2 and its partitioner's
    /// choices for these keys), so that our records land where a Java producer's would.
    #[test]
    fn keys_land_in_the_partitions_kafka_clients_choose() {
        assert_eq!(murmur2(b"21") as i32, -973932308);
        assert_eq!(murmur2(b"foobar") as i32, -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string") as i32, -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32,
            -58897971
        );
        assert_eq!(murmur2(b"abc") as i32, 479470107);
        let partitions = 3;
        for key in [&b"order-1"[..], b"order-2", b"x", b""] {
            assert!(partition_for_key(key, partitions) < partitions);
        }
    }
}
