//! The fake Kubernetes API server ([`integration_tests::fake_apiserver`]) as a process: the
//! whole-agent conformance test (`tests/conformance/agent`) runs `resmgr run` against it.
//!
//! `fake-apiserver <objects.json> <kubeconfig>` serves `resource.k8s.io/v1` (and `nodes`) on a
//! loopback port, stores the objects in the JSON array (a Node, ResourceClaims), writes a
//! kubeconfig pointing at itself, prints `ready <url>` and serves until its standard input closes,
//! which is how the test that started it stops it. Each line of its standard input is a command:
//! `delete <plural> <namespace> <name>` deletes an object as its owner would (`-` for no
//! namespace) and answers `deleted` or `absent` on its standard output.

use std::io::BufRead as _;

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
    // Serve, taking commands, until the test closes our standard input (or goes away).
    let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::task::spawn_blocking(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = commands.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["delete", plural, namespace, name] => {
                let namespace = if *namespace == "-" { "" } else { namespace };
                let answer = if server.delete(plural, namespace, name) {
                    "deleted"
                } else {
                    "absent"
                };
                println!("{answer}");
            }
            _ => eprintln!("fake-apiserver: unknown command {line:?}"),
        }
    }
    Ok(())
}
