//! A consumer of a Kafka topic: reads each partition from where it left off, applies what it
//! read with the consumer's logic, a batch per transaction ([`consumer::apply_batch`]), and
//! then records its next offset (in `consumer.kafka_offsets`, its own database): at-least-once,
//! as a consumer group committing offsets after processing is. Not a consumer group: rskafka
//! has none, so one worker reads every partition itself.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use rskafka::client::partition::{PartitionClient, UnknownTopicHandling};

use crate::connect;
use crate::outbox::consumer::{self, ConsumerKind};
use crate::outbox::event::Event;
use crate::outbox::sink::{KafkaSink, FETCH_MAX_BYTES, FETCH_WAIT_MS};

/// A worker gives up after this many records: far more than any scenario writes, a bound on a
/// topic that never runs dry.
const MAX_RECORDS: usize = 1_000_000;
/// How long a following worker waits before it looks at an empty topic again.
const FOLLOW_POLL: Duration = Duration::from_millis(20);

const READ_OFFSETS: &str =
    "SELECT partition, next_offset FROM consumer.kafka_offsets WHERE topic = $1";
const RECORD_OFFSET: &str = "
INSERT INTO consumer.kafka_offsets (topic, partition, next_offset) VALUES ($1, $2, $3)
ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset";

/// Where the consumer is in each partition of `topic`: the next offset it reads (a partition
/// it has not read yet is not there).
pub async fn offsets(db: &tokio_postgres::Client, topic: &str) -> Result<HashMap<i32, i64>> {
    let rows = db
        .query(READ_OFFSETS, &[&topic])
        .await
        .context("cannot read the consumer's Kafka offsets")?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

pub struct KafkaWorker {
    client: rskafka::client::Client,
    /// A pooled connection, so the consumer's logic prepares its statements once.
    db: deadpool_postgres::Object,
    kind: ConsumerKind,
    /// Per topic: each partition's client and the next offset to read.
    topics: HashMap<String, Vec<(PartitionClient, i64)>>,
}

impl KafkaWorker {
    pub async fn connect(
        url: &str,
        db: deadpool_postgres::Object,
        kind: ConsumerKind,
    ) -> Result<KafkaWorker> {
        Ok(KafkaWorker {
            client: connect::kafka(url).await?,
            db,
            kind,
            topics: HashMap::new(),
        })
    }

    /// Applies what `topic` holds past this consumer's offsets, until none is left: returns how
    /// many records it applied.
    pub async fn drain(&mut self, topic: &str, batch: usize) -> Result<usize> {
        let mut applied = 0;
        while applied < MAX_RECORDS {
            let taken = self.take_and_apply(topic, batch).await?;
            if taken == 0 {
                return Ok(applied);
            }
            applied += taken;
        }
        bail!("topic {topic} did not run dry after {MAX_RECORDS} records")
    }

    /// Applies new records as they come, until killed: the topic is looked at again
    /// [`FOLLOW_POLL`] after it was found empty.
    pub async fn follow(&mut self, topic: &str, batch: usize) -> Result<()> {
        loop {
            if self.take_and_apply(topic, batch).await? == 0 {
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        }
    }

    /// Each partition in turn: up to `batch` records read, applied in one transaction, then
    /// the partition's next offset recorded; how many, over all partitions.
    async fn take_and_apply(&mut self, topic: &str, batch: usize) -> Result<usize> {
        self.open(topic).await?;
        let partitions = self.topics.get_mut(topic).expect("just opened");
        let mut applied = 0;
        for (partition, (client, next)) in partitions.iter_mut().enumerate() {
            let (records, _high_watermark) = client
                .fetch_records(*next, 1..FETCH_MAX_BYTES, FETCH_WAIT_MS)
                .await
                .with_context(|| {
                    format!("cannot read Kafka topic {topic}, partition {partition}")
                })?;
            let taken: Vec<_> = records
                .into_iter()
                .filter(|r| r.offset >= *next)
                .take(batch.max(1))
                .collect();
            let Some(last) = taken.last().map(|r| r.offset) else {
                continue;
            };
            let events = taken
                .iter()
                .map(|r| {
                    serde_json::from_slice::<Event>(r.record.value.as_deref().unwrap_or_default())
                        .map_err(|e| anyhow!("a record of topic {topic} is not an event: {e}"))
                })
                .collect::<Result<Vec<Event>>>()?;
            consumer::apply_batch(&self.db, self.kind, &events).await?;
            *next = last + 1;
            self.db
                .execute(RECORD_OFFSET, &[&topic, &(partition as i32), &*next])
                .await
                .context("cannot record the consumer's Kafka offset")?;
            applied += events.len();
        }
        Ok(applied)
    }

    /// The partitions of `topic` and this consumer's offsets in them, looked up once.
    async fn open(&mut self, topic: &str) -> Result<()> {
        if self.topics.contains_key(topic) {
            return Ok(());
        }
        let count = KafkaSink::partition_count(&self.client, topic).await?;
        let stored = offsets(&self.db, topic).await?;
        let mut partitions = Vec::with_capacity(count as usize);
        for partition in 0..count {
            let client = self
                .client
                .partition_client(topic, partition, UnknownTopicHandling::Error)
                .await?;
            partitions.push((client, stored.get(&partition).copied().unwrap_or(0)));
        }
        self.topics.insert(topic.to_string(), partitions);
        Ok(())
    }
}
