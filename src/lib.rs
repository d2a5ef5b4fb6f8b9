//! outbox-lab: a laboratory for the Transactional Outbox pattern on PostgreSQL.
//!
//! The actors of the article, each in its module: the [`writer`] (business transaction + outbox
//! row), the [`relay`] (fetch, deliver through a [`sink`], mark published) and the [`consumer`]
//! (naive or idempotent, over HTTP). They run as [`child`] processes that die for real at named
//! [`crash`] points. The harness around them: the throwaway PostgreSQL [`cluster`] and the
//! [`db`] server and databases of a run, the [`schema`], the [`scenarios`] (one file per
//! experiment, parameters and expected figures in [`spec`] files), the SQL that [`counts`] what
//! happened, the [`checks`] against the article, and the [`report`]. The storage experiments add
//! bulk [`load`]ing with COPY, plans read with [`explain`], and the daily [`partitions`] of
//! `outbox_p` with their guarded cleanup (also `outbox-lab prune`). Beyond the article: the
//! log-tailing [`cdc`] relay (a logical replication slot, [`pgoutput`] decoded), and a TCP
//! [`proxy`] between relay and consumer that injects network faults. And [`explore`]: every
//! crash point against every design, judged by an invariant checker. Redis Streams come through
//! the [`sink`] and [`stream_consumer`], on a [`redis_server`] of the run's own (a [`throwaway`]
//! directory, like the cluster's). Latency is summarised by [`latency`]; a run's page is drawn
//! by [`html`] and [`plots`], two runs set side by side by [`compare`], long steps shown by
//! [`progress`]. The actors also run on their own ([`standalone`]) with [`logging`].

pub mod cdc;
pub mod checks;
pub mod child;
pub mod cli;
pub mod cluster;
pub mod compare;
pub mod consumer;
pub mod counts;
pub mod crash;
pub mod db;
pub mod event;
pub mod explain;
pub mod explore;
pub mod html;
pub mod latency;
pub mod load;
pub mod logging;
pub mod partitions;
pub mod pgoutput;
pub mod plots;
pub mod progress;
pub mod proxy;
pub mod redis_server;
pub mod relay;
pub mod report;
pub mod scenarios;
pub mod schema;
pub mod sink;
pub mod spec;
pub mod standalone;
pub mod stream_consumer;
pub mod throwaway;
pub mod writer;
