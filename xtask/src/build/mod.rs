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
