//! A run's directory, `results/<run-id>/`, and every file written in it: readable by its
//! owner only, its secrets masked. The results, the histories and the page are all written
//! through here.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, Result};

/// Makes a run's directory (or a folder in it, and what is missing above), readable by its
/// owner only (0700): its files may hold a command line.
pub fn create_run_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

/// Writes `text` into a file of a run's directory, its secrets masked
/// ([`crate::secrets::redact`]), readable by its owner only (0600); `append` adds it at the end.
pub fn write_run_file(path: &Path, text: &str, append: bool) -> Result<()> {
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .append(append)
            .truncate(!append)
            .mode(0o600)
            .open(path)?;
        // A file an older outbox-lab wrote (`report` writes the page again) keeps its mode.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(crate::secrets::redact(text).as_bytes())
    };
    write().with_context(|| format!("cannot write {}", path.display()))
}
