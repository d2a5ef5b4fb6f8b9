//! verify's plot on the report page: the deliveries over the run, with its faults marked.

use anyhow::{Context, Result};

use super::verdict::TIMELINE_TITLE;
use crate::report::plots::{column, number, timeline, Axes, Marker, Plot};
use crate::report::Report;

/// The faults table's title starts so.
const FAULTS: &str = "faults";

/// The timeline of a verify result; none for any other result, or one without it.
pub fn for_report(report: &Report) -> Result<Vec<Plot>> {
    if report.scenario != "verify" {
        return Ok(Vec::new());
    }
    let Some(deliveries) = report.tables.iter().find(|t| t.title == TIMELINE_TITLE) else {
        return Ok(Vec::new());
    };
    if deliveries.rows.is_empty() {
        return Ok(Vec::new());
    }
    let mut markers = Vec::new();
    if let Some(faults) = report.tables.iter().find(|t| t.title.starts_with(FAULTS)) {
        let (fault, at) = (column(faults, "fault")?, column(faults, "at ms")?);
        for row in &faults.rows {
            // A fault not reached has no moment.
            if let Ok(at) = number(&row[at]) {
                markers.push(Marker {
                    at,
                    label: row[fault].clone(),
                });
            }
        }
    }
    let axes = Axes {
        x: "ms from the start of the run",
        y: "first receipts per 100 ms",
    };
    let svg = timeline(deliveries, "ms", "deliveries", &markers, axes)
        .context("cannot plot the timeline of verify")?;
    Ok(vec![Plot {
        id: "verify-timeline",
        title: "Deliveries over the run, and when each fault struck".into(),
        svg,
    }])
}
