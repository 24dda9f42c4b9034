//! Building the Kubernetes API client: in-cluster configuration by default, a kubeconfig file
//! when one is named.
//!
//! TLS is rustls with the ring provider (no cmake/aws-lc build); rustls picks ring on its own
//! because it is the only provider compiled in.

use std::path::{Path, PathBuf};

use ::kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Not running in a pod with a service account, and no kubeconfig named.
    #[error(
        "no in-cluster kubernetes configuration (KUBERNETES_SERVICE_HOST and the service account token); name a kubeconfig to run outside a pod"
    )]
    InCluster(#[source] ::kube::config::InClusterError),
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: ::kube::config::KubeconfigError,
    },
    /// The configuration was read, but no client could be made from it (TLS setup).
    #[error("building the kubernetes client")]
    Client(#[source] ::kube::Error),
}

/// A client from `kubeconfig` if given, else from the pod's service account.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, ConnectError> {
    let config = match kubeconfig {
        None => Config::incluster().map_err(ConnectError::InCluster)?,
        Some(path) => {
            let error = |source| ConnectError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(error)?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(error)?
        }
    };
    Client::try_from(config).map_err(ConnectError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builds_a_tls_client_with_the_ring_provider() {
        // rustls panics here if no crypto provider can be chosen; this proves ring is picked.
        let config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        Client::try_from(config).unwrap();
    }

    #[tokio::test]
    async fn names_the_kubeconfig_that_cannot_be_read() {
        let path = Path::new("/nonexistent/resmgr/kubeconfig");
        let Err(error) = connect(Some(path)).await else {
            panic!("a missing kubeconfig must fail")
        };
        assert!(matches!(&error, ConnectError::Kubeconfig { path: p, .. } if p == path));
        assert!(error.to_string().contains("/nonexistent/resmgr/kubeconfig"));
    }
}
