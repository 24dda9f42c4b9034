//! The NRI plugin's refusals reach the runtime classified, as the DRA side's reach the kubelet:
//! a malformed request is `InvalidArgument`, a container that does not fit `FailedPrecondition`
//! (also when the policy first hears of it at its update, and cannot take it in), a change that
//! could not be saved `Internal`. (That the kind's code is what the runtime receives is the nri
//! crate's test; that a container the policy does not know is `NotFound`, `nri_plugin`'s.)

use std::sync::Arc;

use integration_tests::fakes::{Harness, TestPolicy};
use nri::{Plugin as _, PluginErrorKind, api};
use resmgr::nri_plugin::ResmgrPlugin;

fn pod() -> api::PodSandbox {
    api::PodSandbox {
        id: "sandbox-web".into(),
        name: "web".into(),
        uid: "uid-web".into(),
        namespace: "team".into(),
        ..api::PodSandbox::default()
    }
}

fn container(name: &str) -> api::Container {
    api::Container {
        id: format!("id-{name}"),
        pod_sandbox_id: "sandbox-web".into(),
        name: name.into(),
        ..api::Container::default()
    }
}

fn create(name: &str) -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: Some(pod()),
        container: Some(container(name)),
    }
}

#[tokio::test]
async fn refusals_are_classified_by_their_cause() {
    let harness = Harness::new();
    // Containers in the durable state, so that creating one saves it.
    let policy = TestPolicy {
        durable_containers: true,
        ..TestPolicy::new(4)
    };
    let manager = Arc::new(harness.ready(policy, &[]).await);
    let plugin = ResmgrPlugin::new(manager, Arc::new(()));

    let malformed = api::CreateContainerRequest {
        pod: None,
        ..create("app")
    };
    let error = plugin.create_container(malformed).await.unwrap_err();
    assert_eq!(error.kind, PluginErrorKind::InvalidArgument, "{error}");

    let error = plugin
        .create_container(create("refused-app"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, PluginErrorKind::FailedPrecondition, "{error}");
    assert!(error.message.contains("does not fit"), "{error}");

    let unknown = api::UpdateContainerRequest {
        pod: Some(pod()),
        container: Some(container("refused-ghost")),
        linux_resources: None,
    };
    let error = plugin.update_container(unknown).await.unwrap_err();
    assert_eq!(error.kind, PluginErrorKind::FailedPrecondition, "{error}");
    assert!(
        error
            .message
            .starts_with("container team/web/refused-ghost: ")
            && error.message.contains("does not fit"),
        "{error}"
    );

    harness.break_state_saves();
    let error = plugin.create_container(create("app")).await.unwrap_err();
    assert_eq!(error.kind, PluginErrorKind::Internal, "{error}");
    assert!(error.message.contains("saving the state"), "{error}");
}
