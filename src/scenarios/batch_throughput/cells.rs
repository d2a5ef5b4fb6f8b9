//! The cells of batch-throughput: every configuration measured (a sink, a batch size, the
//! events in flight, the relay's workers), how many events each delivers, which ceiling it is a
//! fraction of, and the prefix of its metrics.

use super::{Params, SinkKind};

/// One configuration measured: a sink, a batch size, (HTTP) the events in flight and (the
/// ceiling, Redis and the brokers) the relay's workers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cell {
    pub(super) sink: SinkKind,
    pub(super) batch: i64,
    /// Events sent and not yet acknowledged at once by one worker: the batch's pipeline for
    /// Redis.
    pub(super) in_flight: i64,
    /// The relay's delivery loops, each its partition of the aggregates.
    pub(super) workers: u32,
}

impl Cell {
    /// Every cell of the parameters, in table order.
    pub(super) fn all(params: &Params) -> Vec<Cell> {
        let mut cells = Vec::new();
        for &sink in &params.sinks {
            for &batch in &params.batch_sizes {
                match sink {
                    // An array of one is one event per request: the http cell measures it.
                    SinkKind::HttpArray if batch == 1 => {}
                    SinkKind::DbOnly
                    | SinkKind::Redis
                    | SinkKind::Nats
                    | SinkKind::Amqp
                    | SinkKind::Kafka => {
                        cells.extend(params.pipeline_workers.iter().map(|&workers| Cell {
                            sink,
                            batch,
                            in_flight: batch,
                            workers,
                        }))
                    }
                    SinkKind::HttpArray => cells.push(Cell {
                        sink,
                        batch,
                        in_flight: batch,
                        workers: 1,
                    }),
                    SinkKind::Http => cells.extend(
                        params
                            .http_in_flight
                            .iter()
                            .map(|&n| i64::from(n))
                            .filter(|&n| n <= batch)
                            .map(|in_flight| Cell {
                                sink,
                                batch,
                                in_flight,
                                workers: 1,
                            }),
                    ),
                }
            }
        }
        cells
    }

    /// How many events it delivers: as the parameters say, times `scale` (this machine's pace,
    /// 1 where it meets the one the parameters are sized for).
    pub(super) fn events(&self, params: &Params, scale: f64) -> i64 {
        let sink_bound = params.max_events_by_sink.get(&self.sink).copied();
        let serial = (self.in_flight == 1).then_some(params.serial_events);
        let events = [sink_bound, serial].into_iter().flatten().fold(
            (self.batch * params.batches_per_cell).min(params.max_events),
            i64::min,
        );
        ((events as f64 * scale).round() as i64).max(1)
    }

    /// The ceiling cell of its batch size and workers, where `cells` has one (and it is not
    /// one itself).
    pub(super) fn ceiling(&self, cells: &[Cell]) -> Option<usize> {
        if self.sink == SinkKind::DbOnly {
            return None;
        }
        cells.iter().position(|other| {
            other.sink == SinkKind::DbOnly
                && other.batch == self.batch
                && other.workers == self.workers
        })
    }

    /// The prefix of its metrics: `redis.batch100` (one worker, as the article's relay),
    /// `db_only.batch100` (its ceiling),
    /// `redis.batch100.workers2`, `http.batch100` (one request at a time, as the article's relay
    /// sends them), `http.batch100.in_flight16`.
    pub(super) fn metric(&self) -> String {
        let name = format!("{}.batch{}", self.sink.name(), self.batch);
        match self.sink {
            SinkKind::Http if self.in_flight > 1 => format!("{name}.in_flight{}", self.in_flight),
            _ if self.workers > 1 => format!("{name}.workers{}", self.workers),
            _ => name,
        }
    }
}
