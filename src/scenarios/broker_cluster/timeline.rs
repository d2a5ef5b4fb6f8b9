//! broker-cluster's timelines: each case's acked probes counted per 100 ms (a detail table),
//! and the plot of them with the kill and the restart marked.

use anyhow::{Context, Result};

use super::leader_killed::Measured;
use super::SUMMARY;
use crate::report::plots::{self, column, number, Axes, Marker, Plot};
use crate::report::{decimals, Report, Table};

/// A timeline's table title starts so; the case follows.
const TIMELINE: &str = "acked probe publishes per 100 ms";
/// The timeline's buckets.
const BUCKET_MS: f64 = 100.0;

/// The acked probes per [`BUCKET_MS`] over the case (by the moment of their ack), for the
/// plot: a run of empty buckets is the failover.
pub(super) fn acks_over_time(case: &str, measured: &Measured) -> Table {
    let acks: Vec<f64> = measured
        .probes
        .iter()
        .filter(|p| p.acked)
        .map(|p| p.sent_ms + p.took_ms)
        .collect();
    let end = measured
        .probes
        .iter()
        .map(|p| p.sent_ms + p.took_ms)
        .fold(0.0, f64::max);
    let buckets = (end / BUCKET_MS).ceil() as usize;
    let mut counts = vec![0u32; buckets.max(1)];
    for at in acks {
        let i = ((at / BUCKET_MS) as usize).min(counts.len() - 1);
        counts[i] += 1;
    }
    let mut table = Table::new(format!("{TIMELINE} ({case})"), &["ms", "acked"]).detail();
    for (i, count) in counts.iter().enumerate() {
        table.push(vec![decimals(i as f64 * BUCKET_MS, 0), count.to_string()]);
    }
    table
}

/// Each case's timeline: acked probes over the run, the kill and the restart marked.
pub(super) fn timelines(report: &Report) -> Result<Vec<Plot>> {
    let Some(summary) = report.tables.iter().find(|t| t.title.starts_with(SUMMARY)) else {
        return Ok(Vec::new());
    };
    let (relay, killed, restarted, leader) = (
        column(summary, "relay")?,
        column(summary, "killed_ms")?,
        column(summary, "restarted_ms")?,
        column(summary, "killed")?,
    );
    let mut plots_out = Vec::new();
    for row in &summary.rows {
        let case = &row[relay];
        let title = format!("{TIMELINE} ({case})");
        let Some(points) = report.tables.iter().find(|t| t.title == title) else {
            continue;
        };
        let markers = [
            Marker {
                at: number(&row[killed])?,
                label: format!("SIGKILL {} (leader)", row[leader]),
            },
            Marker {
                at: number(&row[restarted])?,
                label: format!("{} back", row[leader]),
            },
        ];
        let axes = Axes {
            x: "ms from the start of the writer",
            y: "acked probe publishes per 100 ms",
        };
        let svg = plots::timeline(points, "ms", "acked", &markers, axes)
            .with_context(|| format!("cannot plot the timeline of broker-cluster ({case})"))?;
        plots_out.push(Plot {
            id: match case.as_str() {
                "acked" => "broker-cluster-acked",
                _ => "broker-cluster-fire-and-forget",
            },
            title: format!(
                "The stream leader killed and restarted: what the stream acked over the run \
                 ({case} relay)"
            ),
            svg,
        });
    }
    Ok(plots_out)
}
