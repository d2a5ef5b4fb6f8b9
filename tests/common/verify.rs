//! What the verify tests share: verify on the test binary's cluster or on a throwaway one of
//! its own, and the relays they give it.

use std::path::Path;

use super::{on_own_cluster, run_json, scratch_dir, Run};

/// `outbox-lab verify ARGS --format json` on this test binary's cluster.
pub fn verify(args: &[&str]) -> Run {
    let results = scratch_dir("verify-results");
    run_json(&["verify"], &results, args)
}

/// `outbox-lab verify ARGS --format json` on a throwaway cluster of its own (where the database
/// may be restarted), results in `results`.
pub fn verify_alone(results: &Path, args: &[&str]) -> std::process::Command {
    on_own_cluster(&["verify"], results, args)
}

/// An example relay of examples/relays/.
pub fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/relays")
        .join(name);
    format!("'{}' --batch 20 --mode notify", path.display())
}

/// Our relay command, with `extra` options.
pub fn our_relay(extra: &str) -> String {
    format!(
        "'{}' relay --database-url {{database_url}} --sink {{sink_url}} --mode notify \
         --interval-ms 50 --name {{name}} {extra}",
        env!("CARGO_BIN_EXE_outbox-lab")
    )
}

/// Our relay command, its database and sink from its environment: a broker's URL carries its
/// token there, not in `{sink_url}`.
pub fn our_relay_from_its_environment() -> String {
    format!(
        "'{}' relay --mode notify --interval-ms 50 --name {{name}}",
        env!("CARGO_BIN_EXE_outbox-lab")
    )
}

/// A role of the suite's cluster that may log in and create databases, and nothing more (no
/// CREATEROLE): verify's `--database-url` as a user's plain owner role; dropped with this.
pub struct PlainOwner {
    pub url: String,
    name: String,
}

impl PlainOwner {
    pub fn new(name: &str) -> PlainOwner {
        let name = format!("{name}_{}", std::process::id());
        let cluster = super::server_url();
        let url = super::block_on(async {
            admin()
                .await
                .batch_execute(&format!("CREATE ROLE {name} LOGIN CREATEDB"))
                .await
                .unwrap();
            let maintenance = outbox_lab::harness::db::Database {
                server_url: cluster.to_string(),
                name: "postgres".into(),
            };
            maintenance.as_login(&name, None).unwrap().server_url
        });
        PlainOwner { url, name }
    }
}

impl Drop for PlainOwner {
    fn drop(&mut self) {
        let name = self.name.clone();
        super::block_on(async move {
            let _ = admin()
                .await
                .batch_execute(&format!("DROP ROLE IF EXISTS {name}"))
                .await;
        });
    }
}

/// A session of the suite's cluster's own role.
async fn admin() -> tokio_postgres::Client {
    let config = outbox_lab::connect::parse_url(super::server_url()).unwrap();
    outbox_lab::connect::postgres(&config).await.unwrap()
}
