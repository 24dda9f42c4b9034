//! What the e2e stages and the release need built besides the workspace, each in a module of its
//! own that builds one thing and knows nothing of who runs it: the runtimes (containerd and
//! crictl, CRI-O), each Kubernetes release's control plane and kubelet, the `helm` command, the
//! e2e's test image, the agent's image and the node-v2 stage's VM image. The Go builds go to [`cache`] and can run in the
//! [`background`].

pub mod agent_image;
pub mod background;
pub mod cache;
pub mod containerd;
pub mod crio;
pub mod helm;
pub mod kubernetes;
pub mod test_image;
pub mod vm_image;

use std::process::Command;

/// `go`, for a build of ours in the background: `nice`d, so that the steps in the foreground
/// keep their pace, and with the compiler's garbage collector at a quarter of its usual work
/// (`GOGC=400`). The builds are CPU-bound on two cores, and measured here a cold build of
/// kube-scheduler took 211 s instead of 246 s (327 instead of 404 CPU seconds of user time),
/// no process of it growing past 2 GB either way. GOGC is no input of Go's build cache: what it
/// builds is the same.
pub fn background_go() -> Command {
    let mut go = Command::new("nice");
    go.args(["-n", "10", "go"]).env("GOGC", "400");
    go
}
