//! `outbox-lab clean`: throwaway servers and databases that runs left behind.

use std::process::ExitCode;

use anyhow::Result;

use super::outln;
use crate::error::exit;
use crate::harness::{db, throwaway};

/// What was removed, and what was left and why.
pub async fn run(database_url: Option<&str>) -> Result<ExitCode> {
    for cleaned in throwaway::clean() {
        match cleaned {
            throwaway::Cleaned::Removed(dir) => outln!("removed {}", dir.display())?,
            throwaway::Cleaned::InUse(dir) => {
                outln!("left {}: its run is still going", dir.display())?
            }
            throwaway::Cleaned::Left(dir, why) => outln!("left {}: {why}", dir.display())?,
        }
    }
    if let Some(url) = database_url {
        for cleaned in db::clean_databases(url).await? {
            match cleaned {
                db::CleanedDatabase::Dropped(name) => outln!("dropped database {name}")?,
                db::CleanedDatabase::InUse(name) => {
                    outln!("left database {name}: its run is still going, or it is in use")?
                }
                db::CleanedDatabase::DroppedRole(name) => outln!("dropped role {name}")?,
                db::CleanedDatabase::RoleInUse(name) => {
                    outln!("left role {name}: its run is still going, or it is logged in")?
                }
                db::CleanedDatabase::LeftRole(name, why) => outln!("left role {name}: {why}")?,
            }
        }
    }
    Ok(ExitCode::from(exit::OK))
}
