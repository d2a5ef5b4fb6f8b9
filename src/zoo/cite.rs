//! An entry's citations of its library's source: each `[[cite]]` of its zoo.toml names a file
//! of the installed, pinned package, its lines and a short quote of what the entry's prose
//! rests on (`zoo --citations` checks that the quote is on those lines); and every citation its
//! prose makes (`worker.js:288` in its README, FINDING, zoo.toml or adapter) must be one of
//! them, so that a line number typed by hand is checked too.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// `[[cite]]`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiteFile {
    /// `path:lines`: the path from the installed packages' root (npm: `node_modules/`; PyPI:
    /// the venv's `site-packages/`; crates.io: the registry's source directory, so the path
    /// starts with `<crate>-<version>/`), lines `288` or `362-369`.
    at: String,
    /// Words that are on those lines, as they are there (whitespace runs match any whitespace).
    quote: String,
    /// A file not in the package (the library's repository at the pinned tag, its docs): its
    /// address. Such a citation is declared with its quote, but checked by reading, not here.
    #[serde(default)]
    upstream: Option<String>,
}

/// One citation of an entry: where, and what is there.
#[derive(Debug, Clone)]
pub struct Citation {
    pub path: String,
    pub lines: Lines,
    pub quote: String,
    pub upstream: Option<String>,
}

/// Lines `first..=last`, counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lines {
    pub first: usize,
    pub last: usize,
}

impl std::fmt::Display for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.first == self.last {
            true => write!(f, "{}", self.first),
            false => write!(f, "{}-{}", self.first, self.last),
        }
    }
}

impl Lines {
    fn parse(text: &str) -> Option<Lines> {
        let number = |n: &str| n.parse::<usize>().ok().filter(|&n| n > 0);
        let (first, last) = match text.split_once('-') {
            Some((first, last)) => (number(first)?, number(last)?),
            None => (number(text)?, number(text)?),
        };
        (first <= last).then_some(Lines { first, last })
    }
}

impl Citation {
    pub fn from_file(cite: CiteFile) -> Result<Citation> {
        let bad = || {
            anyhow!(
                "[[cite]] at = '{}': path:lines (lines 12 or 12-18)",
                cite.at
            )
        };
        let (path, lines) = cite.at.rsplit_once(':').ok_or_else(bad)?;
        let lines = Lines::parse(lines).ok_or_else(bad)?;
        if path.is_empty() || Path::new(path).is_absolute() || path.contains("..") {
            bail!("[[cite]] at = '{}': a path inside the package", cite.at);
        }
        if cite.quote.trim().is_empty() {
            bail!("[[cite]] at = '{}': a quote of what is there", cite.at);
        }
        Ok(Citation {
            path: path.to_string(),
            lines,
            quote: cite.quote,
            upstream: cite.upstream,
        })
    }

    /// `path:lines`, as the prose cites it.
    pub fn at(&self) -> String {
        format!("{}:{}", self.path, self.lines)
    }

    /// Whether the prose's `cited` (`dist/worker.js:288`, a path's tail) names this citation.
    fn names(&self, cited: &ProseCitation) -> bool {
        let tail = &cited.path;
        let path_matches = self.path == *tail || self.path.ends_with(&format!("/{tail}"));
        path_matches && self.lines == cited.lines
    }

    /// What is wrong with it in the package installed at `root`: `None` when the quote is on
    /// its lines.
    pub fn check(&self, root: &Path) -> Option<String> {
        let file = root.join(&self.path);
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) => {
                return Some(format!(
                    "cannot read {}: {e} (scripts/setup --zoo installs the package)",
                    file.display()
                ))
            }
        };
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() < self.lines.last {
            return Some(format!(
                "{} has {} lines, not {}",
                self.path,
                lines.len(),
                self.lines.last
            ));
        }
        let cited = squeeze(&lines[self.lines.first - 1..self.lines.last].join(" "));
        match cited.contains(&squeeze(&self.quote)) {
            true => None,
            false => Some(format!(
                "'{}' is not on {}: {}",
                self.quote,
                self.at(),
                shorten(&cited)
            )),
        }
    }
}

/// Runs of whitespace as one space: a quote may be wrapped where its source is not.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn shorten(text: &str) -> String {
    const SHOWN: usize = 160;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// Where a registry's installer put an entry's packages, once `scripts/setup --zoo` ran.
pub fn installed_root(registry: &str, entry_dir: &Path) -> Result<Option<PathBuf>> {
    match registry {
        "npm" => Ok(Some(entry_dir.join("node_modules"))),
        "PyPI" => {
            let lib = entry_dir.join(".venv/lib");
            let Ok(listing) = std::fs::read_dir(&lib) else {
                return Ok(Some(lib));
            };
            let python = listing
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.join("site-packages").is_dir());
            Ok(Some(python.map_or(lib, |p| p.join("site-packages"))))
        }
        "crates.io" => {
            // Cargo unpacks every crate of crates.io under one directory per index.
            let home = match std::env::var_os("CARGO_HOME") {
                Some(home) => PathBuf::from(home),
                None => PathBuf::from(std::env::var_os("HOME").context("no HOME")?).join(".cargo"),
            };
            let src = home.join("registry/src");
            let index = std::fs::read_dir(&src)
                .ok()
                .and_then(|listing| {
                    listing.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
                        p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("index.crates.io-"))
                    })
                })
                .unwrap_or(src);
            Ok(Some(index))
        }
        _ => Ok(None),
    }
}

/// A citation the prose makes: `dist/worker.js:288`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProseCitation {
    pub file: PathBuf,
    pub path: String,
    pub lines: Lines,
}

/// The kinds of file a citation names (a source file or a doc of the library).
const CITED_KINDS: [&str; 9] = ["js", "ts", "mjs", "py", "rs", "md", "toml", "sql", "sh"];

/// Every `path:lines` citation in `text` (of `file`) whose path is not the entry's own file
/// (`own`). A bare `:lines` (`` `:80-91` ``) cites the path cited last.
pub fn in_prose(file: &Path, text: &str, own: impl Fn(&str) -> bool) -> Vec<ProseCitation> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut found = Vec::new();
    let mut last_path: Option<&str> = None;
    for (colon, _) in text.match_indices(':') {
        let start = text[..colon]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_path_char(c))
            .last()
            .map_or(colon, |(i, _)| i);
        let end = text[colon + 1..]
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_digit() || c == '-'))
            .map_or(text.len(), |(i, _)| colon + 1 + i);
        let Some(lines) = Lines::parse(text[colon + 1..end].trim_end_matches('-')) else {
            continue;
        };
        let path = match text[start..colon].trim_start_matches(['.', '/']) {
            "" if start == colon => match last_path {
                Some(path) => path,
                None => continue,
            },
            path => path,
        };
        let kind = path.rsplit_once('.').map(|(_, kind)| kind);
        if !kind.is_some_and(|kind| CITED_KINDS.contains(&kind)) {
            continue;
        }
        last_path = Some(path);
        if !own(path) {
            found.push(ProseCitation {
                file: file.to_path_buf(),
                path: path.to_string(),
                lines,
            });
        }
    }
    found
}

/// The prose citations that no citation of `citations` declares.
pub fn undeclared(prose: Vec<ProseCitation>, citations: &[Citation]) -> Vec<ProseCitation> {
    prose
        .into_iter()
        .filter(|cited| !citations.iter().any(|c| c.names(cited)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cite(at: &str, quote: &str) -> Citation {
        Citation::from_file(CiteFile {
            at: at.into(),
            quote: quote.into(),
            upstream: None,
        })
        .unwrap()
    }

    #[test]
    fn a_quote_must_be_on_its_lines() {
        let dir = std::env::temp_dir().join(format!("cite-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg/dist")).unwrap();
        std::fs::write(
            dir.join("pkg/dist/w.js"),
            "a\n  completeJob(\n    job);\nb\n",
        )
        .unwrap();
        assert_eq!(
            cite("pkg/dist/w.js:2-3", "completeJob( job);").check(&dir),
            None
        );
        let wrong_line = cite("pkg/dist/w.js:4", "completeJob").check(&dir).unwrap();
        assert!(
            wrong_line.contains("is not on pkg/dist/w.js:4"),
            "{wrong_line}"
        );
        let past_end = cite("pkg/dist/w.js:3-5", "job").check(&dir).unwrap();
        assert!(past_end.contains("has 4 lines, not 5"), "{past_end}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn prose_citations_are_found_and_matched_by_their_tail() {
        let text = "(`worker.js:288`), lib.js:363-371, `:12`; see zoo.toml:21, https://x.org:80, \
                    12:30 and a: 3.";
        let prose = in_prose(Path::new("README.md"), text, |path| path == "zoo.toml");
        let cited: Vec<String> = prose
            .iter()
            .map(|c| format!("{}:{}", c.path, c.lines))
            .collect();
        assert_eq!(cited, ["worker.js:288", "lib.js:363-371", "lib.js:12"]);
        let citations = [cite(
            "graphile-worker/dist/worker.js:288",
            "completeJob(job);",
        )];
        let left = undeclared(prose, &citations);
        assert_eq!(left.len(), 2);
        assert_eq!(left[0].path, "lib.js");
    }

    #[test]
    fn a_citation_is_a_path_and_lines_with_a_quote() {
        for at in [
            "worker.js",
            "worker.js:0",
            "worker.js:9-3",
            "/etc/passwd:1",
            "../x.js:1",
        ] {
            let cite = CiteFile {
                at: at.into(),
                quote: "x".into(),
                upstream: None,
            };
            assert!(Citation::from_file(cite).is_err(), "{at}");
        }
    }
}
