//! `outbox-lab prune`: old daily partitions of a partitioned outbox, detached and dropped.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::outln;
use crate::connect;
use crate::error::exit;
use crate::ops::partitions::{self, Action, Age};

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The database of the partitioned outbox.
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Prune partitions whose range ended at least this long ago: 3d, 12h, 90m, 30s.
    #[arg(long, value_name = "AGE")]
    older_than: String,
    /// The partitioned outbox (daily RANGE partitions on created_at, as the article's).
    #[arg(long, default_value = "outbox_p")]
    table: String,
    /// Say what would be dropped and kept; change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(args: PruneArgs) -> Result<ExitCode> {
    let older_than: Age = args
        .older_than
        .parse()
        .map_err(|e| anyhow::anyhow!("--older-than: {e}"))?;
    let mut client = connect::postgres(&connect::parse_url(&args.database_url)?).await?;
    let pruned = partitions::prune(&mut client, &args.table, older_than, args.dry_run).await?;
    if pruned.is_empty() {
        outln!(
            "nothing to prune: no partition of {} ended {} ago or earlier",
            args.table,
            args.older_than
        )?;
    }
    for p in &pruned {
        match p.action {
            Action::Kept => crate::errln!("outbox-lab: warning: {p}"),
            _ => outln!("{p}")?,
        }
    }
    if args.dry_run {
        outln!("dry run: nothing was changed")?;
    }
    Ok(ExitCode::from(exit::OK))
}
