//! The fake Kubernetes API server ([`integration_tests::fake_apiserver`]) as a process: the
//! whole-agent conformance test (`tests/conformance/agent`) runs `resmgr run` against it.
//!
//! `fake-apiserver <objects.json> <kubeconfig>` serves `resource.k8s.io/v1` (and `nodes`) on a
//! loopback port, stores the objects in the JSON array (a Node, ResourceClaims), writes a
//! kubeconfig pointing at itself, prints `ready <url>` and serves until its standard input closes,
//! which is how the test that started it stops it.

use std::io::Read as _;

use anyhow::Context as _;
use integration_tests::fake_apiserver::FakeApiServer;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, objects, kubeconfig] = args.as_slice() else {
        anyhow::bail!("usage: fake-apiserver <objects.json> <kubeconfig>");
    };
    let objects: Vec<serde_json::Value> = serde_json::from_slice(
        &std::fs::read(objects).with_context(|| format!("reading {objects}"))?,
    )
    .with_context(|| format!("parsing {objects}"))?;
    let server = FakeApiServer::start(&["v1"]).await;
    for object in objects {
        server.insert(object);
    }
    let url = server.url();
    std::fs::write(
        kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{url}\"}}\n\
             users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\n\
             current-context: fake\n"
        ),
    )
    .with_context(|| format!("writing {kubeconfig}"))?;
    println!("ready {url}");
    // Serve until the test closes our standard input (or goes away).
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await?;
    Ok(())
}
