//! scripts/setup installs chromium only for the tests (`--test`), the zoo's libraries once per
//! lock file (`--zoo`, and `--test`; npm's without install scripts), and CI runs the README's test command. Runs the script with stand-ins for apt-get and the programs it looks for, so that
//! nothing is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A PATH of stand-ins: everything present but chromium (unless `with_chromium`); `apt-get`
/// writes what it was asked to `calls`.
fn fake_path(name: &str, with_chromium: bool) -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("setup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = dir.join("calls");
    let mut present = vec![
        "initdb",
        "postgres",
        "redis-server",
        "nats-server",
        "psql",
        "redis-cli",
        "cargo",
        "useradd",
        "python3",
        "rabbitmq-server",
        "node",
    ];
    if with_chromium {
        present.push("chromium");
    }
    for name in present {
        write_script(&bin.join(name), "exit 0");
    }
    // apt-get installs chromium as a stand-in too.
    let chromium = bin.join("chromium");
    let apt_get = format!(
        "echo \"apt-get $*\" >> {}\n\
         case \" $* \" in *' install '*' chromium '*) printf 'exit 0\\n' > {c}; chmod +x {c};; esac",
        calls.display(),
        c = chromium.display()
    );
    write_script(&bin.join("apt-get"), &apt_get);
    // npm installs into the entry's node_modules.
    let npm = format!(
        "echo \"npm $*\" >> {}\nmkdir -p node_modules",
        calls.display()
    );
    write_script(&bin.join("npm"), &npm);
    write_script(&bin.join("sudo"), "\"$@\"");
    for tool in [
        "id",
        "sort",
        "tail",
        "bash",
        "env",
        "chmod",
        "mkdir",
        "cat",
        "cut",
        "wc",
        "sha256sum",
    ] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} not found"));
        std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
    }
    (bin, calls)
}

fn write_script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/bash\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs scripts/setup with `args` on the stand-ins and an empty zoo; what apt-get was asked.
fn setup(name: &str, args: &[&str], with_chromium: bool) -> String {
    let zoo = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("setup-zoo-{name}"));
    let _ = std::fs::remove_dir_all(&zoo);
    std::fs::create_dir_all(&zoo).unwrap();
    setup_with_zoo(name, args, with_chromium, &zoo)
}

/// Runs scripts/setup with `args` on the stand-ins and the zoo at `zoo`; what apt-get and npm
/// were asked.
fn setup_with_zoo(name: &str, args: &[&str], with_chromium: bool, zoo: &Path) -> String {
    let (bin, calls) = fake_path(name, with_chromium);
    let out = Command::new("/bin/bash")
        .arg(root().join("scripts/setup"))
        .args(args)
        .env_clear()
        .env("PATH", &bin)
        // What it looks for at fixed paths: Debian's python3 (with psycopg and redis-py) and
        // the broker's script, stand-ins too, whatever this machine has.
        .env("OUTBOX_LAB_SETUP_PYTHON3", bin.join("python3"))
        .env(
            "OUTBOX_LAB_SETUP_RABBITMQ_SERVER",
            bin.join("rabbitmq-server"),
        )
        .env("OUTBOX_LAB_SETUP_ZOO", zoo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(calls).unwrap_or_default()
}

#[test]
fn chromium_is_installed_only_for_the_tests() {
    let calls = setup("main", &[], false);
    assert!(!calls.contains("chromium"), "scripts/setup asked: {calls}");
    let calls = setup("test", &["--test"], false);
    assert!(
        calls.contains("install") && calls.contains("chromium"),
        "scripts/setup --test asked: {calls}"
    );
    // Idempotent: nothing missing, nothing installed.
    let calls = setup("again", &["--test"], true);
    assert!(calls.is_empty(), "scripts/setup --test asked: {calls}");
}

/// A zoo entry's library is installed once per lock file: again only when the lock changed.
#[test]
fn the_zoo_is_installed_once_per_lock_file() {
    let zoo = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("setup-zoo-entries");
    let _ = std::fs::remove_dir_all(&zoo);
    let entry = zoo.join("some_library");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("zoo.toml"), "").unwrap();
    std::fs::write(entry.join("package-lock.json"), "{}").unwrap();
    let calls = setup_with_zoo("zoo-first", &["--zoo"], false, &zoo);
    // No package's install script runs: a stranger's code runs only as the relay.
    assert!(
        calls.contains("npm ci --ignore-scripts"),
        "scripts/setup --zoo asked: {calls}"
    );
    assert!(
        !calls.contains("chromium"),
        "scripts/setup --zoo asked: {calls}"
    );
    let calls = setup_with_zoo("zoo-again", &["--zoo"], false, &zoo);
    assert!(calls.is_empty(), "scripts/setup --zoo asked again: {calls}");
    std::fs::write(entry.join("package-lock.json"), "{\"changed\": 1}").unwrap();
    let calls = setup_with_zoo("zoo-changed", &["--zoo"], false, &zoo);
    assert!(
        calls.contains("npm ci"),
        "a new lock file was not installed: {calls}"
    );
}

/// The zoo's npm entries install with `--ignore-scripts`, and none of their locked packages has
/// an install script to miss (npm marks such a package `hasInstallScript` in the lock file).
#[test]
fn no_zoo_package_needs_an_install_script() {
    let zoo = root().join("examples/zoo");
    let mut locks = 0;
    for entry in std::fs::read_dir(&zoo).unwrap() {
        let lock = entry.unwrap().path().join("package-lock.json");
        if let Ok(text) = std::fs::read_to_string(&lock) {
            locks += 1;
            assert!(
                !text.contains("\"hasInstallScript\""),
                "{} has a package with an install script",
                lock.display()
            );
        }
    }
    assert!(locks >= 2, "the zoo's npm entries: {locks} lock files");
}

/// CI runs exactly the README's test command (a line of its own), which installs chromium for
/// the tests.
#[test]
fn ci_runs_the_readme_test_command() {
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let readme_command = readme
        .lines()
        .find(|l| l.contains("# the test suite"))
        .and_then(|l| l.split('#').next())
        .unwrap()
        .trim();
    assert!(
        ci.lines().any(|line| line.trim() == readme_command),
        "'{readme_command}' is not a line of .ci/run:\n{ci}"
    );
    assert!(
        readme_command.starts_with("scripts/setup --test && cargo test"),
        "{readme_command}"
    );
}
