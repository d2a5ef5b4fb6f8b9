//! A result's table: its title, columns and rows of text, made from a query's rows or by hand,
//! printed as psql prints one, and kept whole in the JSON, the CSV and the page.

use comfy_table::{CellAlignment, ContentArrangement};
use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::Row;

/// psql's look: `|` between columns, `-+-` under the header, no outer border.
const PSQL_STYLE: &str = "     -+ |          ";

/// A table as printed, stored as CSV and put in JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Raw data behind a plot (every latency sample): in the JSON, the CSV and the page, but
    /// left off the terminal, where its rows would bury the results.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detail: bool,
}

impl Table {
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Table {
        Table {
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: vec![],
            detail: false,
        }
    }

    /// Marks the table as raw data: kept in the files and the page, not printed on a terminal.
    pub fn detail(mut self) -> Table {
        self.detail = true;
        self
    }

    /// The index of the column named `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// The same table with only these columns (in this order); None if one is missing.
    pub fn select(&self, names: &[&str]) -> Option<Table> {
        let indexes: Vec<usize> = names
            .iter()
            .map(|n| self.column(n))
            .collect::<Option<_>>()?;
        Some(Table {
            title: self.title.clone(),
            columns: names.iter().map(|n| n.to_string()).collect(),
            rows: self
                .rows
                .iter()
                .map(|r| indexes.iter().map(|&i| r[i].clone()).collect())
                .collect(),
            detail: self.detail,
        })
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// A table straight from a query's rows, columns named as in the SELECT.
    pub fn from_rows(title: impl Into<String>, rows: &[Row]) -> Table {
        let columns = rows
            .first()
            .map(|r| r.columns().iter().map(|c| c.name().to_string()).collect())
            .unwrap_or_default();
        let rows = rows
            .iter()
            .map(|r| (0..r.len()).map(|i| cell(r, i)).collect())
            .collect();
        Table {
            title: title.into(),
            columns,
            rows,
            detail: false,
        }
    }

    /// For each column: does every row hold a number there (aligned right, as psql does)?
    pub fn numeric_columns(&self) -> Vec<bool> {
        (0..self.columns.len())
            .map(|i| {
                !self.rows.is_empty()
                    && self
                        .rows
                        .iter()
                        .all(|r| r.get(i).is_some_and(|c| c.parse::<f64>().is_ok()))
            })
            .collect()
    }

    pub fn render(&self) -> String {
        let mut table = comfy_table::Table::new();
        table
            .load_preset(PSQL_STYLE)
            .set_content_arrangement(ContentArrangement::Disabled);
        table.set_header(&self.columns);
        for row in &self.rows {
            table.add_row(row);
        }
        let numeric = self.numeric_columns();
        for (column, numeric) in table.column_iter_mut().zip(numeric) {
            if numeric {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        // comfy-table pads the last column; psql does not.
        let text = table.to_string();
        text.lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A column of a query result as text; timestamps as the article prints them (HH:MM:SS.mmm).
fn cell(row: &Row, i: usize) -> String {
    let ty = row.columns()[i].type_();
    let text = match *ty {
        Type::INT2 => row.get::<_, Option<i16>>(i).map(|v| v.to_string()),
        Type::INT4 => row.get::<_, Option<i32>>(i).map(|v| v.to_string()),
        Type::INT8 => row.get::<_, Option<i64>>(i).map(|v| v.to_string()),
        Type::FLOAT4 => row.get::<_, Option<f32>>(i).map(|v| v.to_string()),
        Type::FLOAT8 => row.get::<_, Option<f64>>(i).map(|v| format!("{v:.3}")),
        Type::BOOL => row
            .get::<_, Option<bool>>(i)
            .map(|v| if v { "t" } else { "f" }.to_string()),
        Type::UUID => row.get::<_, Option<uuid::Uuid>>(i).map(|v| v.to_string()),
        Type::TIMESTAMPTZ => row
            .get::<_, Option<chrono::DateTime<chrono::Utc>>>(i)
            .map(|v| v.format("%H:%M:%S%.3f").to_string()),
        Type::JSON | Type::JSONB => row
            .get::<_, Option<serde_json::Value>>(i)
            .map(|v| v.to_string()),
        _ => row
            .try_get::<_, Option<String>>(i)
            .unwrap_or_else(|_| Some(format!("<{ty}>"))),
    };
    text.unwrap_or_default()
}
