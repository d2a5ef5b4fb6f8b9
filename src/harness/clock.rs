//! A wall clock that lies, for the clock nemeses (`clock:step:relay`, `clock:step:db`): the
//! processes it is given to (relay 0, with every process of it started again; the throwaway
//! cluster's server) run with libfaketime preloaded, reading their offset from a timestamp
//! file of the run's at every call (no cache), so that a step takes effect at once; their
//! monotonic clock stays true, as it is in production (and Node.js and asyncio timeouts need
//! it). libfaketime is the build of the PyPI wheel `libfaketime` 3.0.1, pinned by hash and
//! installed by `scripts/setup` (scripts/faketime): Debian's 0.9.10 breaks Python 3.11's
//! `time.sleep` (libfaketime#426).
//!
//! It reaches a dynamically linked program only: a statically linked one (Go, Rust's
//! `+crt-static`) reads the clock past it, which [`statically_linked`] tells.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use nix::unistd::{chown, User};

use super::throwaway::{self, RunDir};

/// Where `scripts/setup` puts the library.
const LIBRARY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/scripts/faketime/bin/libfaketime.so.1"
);
/// The offset file's name in its directory.
const OFFSET_FILE: &str = "offset";

/// A clock of the run's: its offset, and the file the processes given it read it from.
#[derive(Debug)]
pub struct FakeClock {
    /// A directory of ours the reader's group may enter, holding [`OFFSET_FILE`].
    dir: RunDir,
    /// How far it is off now, in ms (steps add up).
    offset_ms: Mutex<i64>,
    /// Who reads its file, when not ourselves.
    reader: Option<User>,
}

impl FakeClock {
    /// A clock set true (offset 0), whose file `reader` (the user the processes run as, when
    /// not ourselves) may read.
    pub fn new(reader: Option<&User>) -> Result<FakeClock> {
        library()?;
        let dir = RunDir::create("clock", reader)?;
        let clock = FakeClock {
            dir,
            offset_ms: Mutex::new(0),
            reader: reader.cloned(),
        };
        clock.write(0)?;
        Ok(clock)
    }

    /// What a process is given to run on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        let offset = self.dir.path().join(OFFSET_FILE);
        vec![
            ("LD_PRELOAD".into(), LIBRARY.into()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                offset.display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }

    /// Steps the clock by `by_ms` (signed, adding to the steps before); its offset now.
    pub fn step(&self, by_ms: i64) -> Result<i64> {
        let mut offset = self.offset_ms.lock().expect("not poisoned");
        *offset += by_ms;
        self.write(*offset)?;
        Ok(*offset)
    }

    /// Writes the offset (libfaketime's relative form: `+60.000`, seconds) to a new file and
    /// renames it over the old one, so that a reader never sees half of it.
    fn write(&self, offset_ms: i64) -> Result<()> {
        let sign = if offset_ms < 0 { '-' } else { '+' };
        let text = format!(
            "{sign}{}.{:03}\n",
            offset_ms.abs() / 1000,
            offset_ms.abs() % 1000
        );
        let path = self.dir.path().join(OFFSET_FILE);
        let temp = self.dir.path().join(format!("{OFFSET_FILE}.new"));
        let _ = fs::remove_file(&temp);
        let mut file = throwaway::create_new(&temp)?;
        file.write_all(text.as_bytes())?;
        let mode = match &self.reader {
            Some(user) => {
                chown(&temp, None, Some(user.gid))?;
                0o640
            }
            None => 0o600,
        };
        fs::set_permissions(&temp, fs::Permissions::from_mode(mode))?;
        fs::rename(&temp, &path).with_context(|| format!("cannot write {}", path.display()))
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(self.dir.path());
    }
}

/// The library, once `scripts/setup` has installed it.
fn library() -> Result<&'static Path> {
    let library = Path::new(LIBRARY);
    if !library.is_file() {
        bail!(
            "the clock nemeses need libfaketime, not found at {LIBRARY}: run scripts/setup, \
             which installs it"
        );
    }
    Ok(library)
}

/// Whether `program` (a path, or a name on PATH) is an ELF executable that names no dynamic
/// loader: libfaketime, preloaded by the loader, cannot reach its clock. A script (its
/// interpreter is what runs) or a program not found is not.
pub fn statically_linked(program: &str) -> bool {
    let path = match program.contains('/') {
        true => PathBuf::from(program),
        false => match std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        }) {
            Some(found) => found,
            None => return false,
        },
    };
    let Ok(bytes) = fs::read(&path) else {
        return false;
    };
    elf_without_interpreter(&bytes)
}

/// An ELF file (64-bit, little-endian) with no PT_INTERP program header.
fn elf_without_interpreter(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false;
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    let u64_at = |at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(word) as usize
    };
    let (table, entry_size, entries) = (u64_at(32), u16_at(54), u16_at(56));
    (0..entries).all(|k| {
        let at = table + k * entry_size;
        bytes.len() < at + 4
            || u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) != PT_INTERP
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shell is dynamically linked (it names a loader): libfaketime reaches it; a script
    /// is what its interpreter makes of it; a file that is no ELF is not static.
    #[test]
    fn a_dynamically_linked_program_is_told_from_a_static_one() {
        assert!(!statically_linked("sh"));
        assert!(!statically_linked("/nonexistent/relay"));
        let bytes = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(!elf_without_interpreter(&bytes));
        // The same file with its PT_INTERP header renamed (type 3 -> 1, PT_LOAD): static.
        let mut statically = bytes.clone();
        let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
        let table = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
        let (size, count) = (u16_at(&bytes, 54), u16_at(&bytes, 56));
        for k in 0..count {
            let at = table + k * size;
            if statically[at..at + 4] == 3u32.to_le_bytes() {
                statically[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
            }
        }
        assert!(elf_without_interpreter(&statically));
        assert!(!elf_without_interpreter(b"#!/bin/sh\n"));
    }
}
