//! `resmgr slices`: the ResourceSlices the agent would publish for a node, as YAML or JSON.
//!
//! It answers "what will my node advertise?" before the agent runs there: the same settings as
//! `resmgr run` (every flag and `--config`, resolved and checked by [`crate::config`]), the
//! same policy ([`crate::config::RunConfig::policy`]) and the objects the publisher creates for a new
//! node ([`kube_dra::slices::first_publication`]), so what it prints is what the agent
//! writes, not a description of it. The API server adds each slice's name (from its
//! `generateName`); the owner reference needs the Node's uid, which only the API server knows,
//! so it is printed with `--node-uid` only. `kubectl create -f` takes the output as it is.

use std::{io::Write as _, process::ExitCode};

use kube_dra::{ResourceApiVersion, slices::first_publication};
use serde_json::{Value, json};

use crate::config::RunFlags;

/// How to print the objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One YAML document per slice.
    Yaml,
    /// One JSON `List` of the slices.
    Json,
}

/// The `resource.k8s.io` version to write, the one the cluster serves (the agent discovers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiVersion {
    /// Kubernetes 1.34 and later.
    V1,
    /// Kubernetes 1.33.
    V1beta2,
    /// Kubernetes 1.32.
    V1beta1,
}

impl From<ApiVersion> for ResourceApiVersion {
    fn from(v: ApiVersion) -> Self {
        match v {
            ApiVersion::V1 => Self::V1,
            ApiVersion::V1beta2 => Self::V1beta2,
            ApiVersion::V1beta1 => Self::V1beta1,
        }
    }
}

/// `resmgr slices`' own flags, and the agent's settings.
#[derive(Debug, clap::Args)]
pub struct SliceArgs {
    /// The Node object's uid, for the owner reference the agent sets (`kubectl get node NAME -o
    /// jsonpath='{.metadata.uid}'`); without it the slices have no owner.
    #[arg(long, value_name = "UID")]
    node_uid: Option<String>,
    /// `yaml` or `json`.
    #[arg(long, value_enum, default_value_t = Output::Yaml)]
    output: Output,
    /// The `resource.k8s.io` version to write.
    #[arg(long, value_enum, default_value_t = ApiVersion::V1)]
    api_version: ApiVersion,
    #[command(flatten)]
    settings: Settings,
}

/// The settings of `resmgr run`, as its flags.
#[derive(Debug)]
struct Settings(RunFlags);

impl clap::FromArgMatches for Settings {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self(RunFlags::settings_from(matches)))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for Settings {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        RunFlags::setting_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        RunFlags::setting_args(cmd)
    }
}

pub fn main(args: &SliceArgs, node_name_env: Option<String>) -> anyhow::Result<ExitCode> {
    let config = args.settings.0.resolve(node_name_env)?;
    let Some(dra) = &config.dra else {
        anyhow::bail!(
            "{}: false: without DRA the agent publishes no resource slices",
            config.origin("dra")
        );
    };
    let publisher = &dra.publisher;
    let node_name = &dra.node_name;
    if let Some(uid) = &args.node_uid
        && uid.trim().is_empty()
    {
        anyhow::bail!("--node-uid: empty: expected the Node's metadata.uid");
    }
    let policy = config.policy()?;
    // As the agent does: devices or an error, and no devices is one empty slice (with
    // `cpu-exclusivity: pods`), which tells the scheduler the driver is here with nothing to give.
    let devices = policy
        .devices()
        .map_err(|e| anyhow::anyhow!("the agent would publish nothing: {e}"))?;
    let objects = first_publication(
        publisher,
        args.api_version.into(),
        args.node_uid.as_deref(),
        &devices,
    )?;
    if args.node_uid.is_none() {
        eprintln!(
            "resmgr: no --node-uid: the slices are printed without the owner reference to Node \
             {node_name} the agent gives them"
        );
    }
    let text = match args.output {
        Output::Yaml => {
            let mut text = String::new();
            for object in &objects {
                text.push_str("---\n");
                text.push_str(&serde_yaml_ng::to_string(object)?);
            }
            text
        }
        Output::Json => {
            let list = json!({"apiVersion": "v1", "kind": "List", "items": Value::from(objects)});
            serde_json::to_string_pretty(&list)? + "\n"
        }
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| anyhow::anyhow!("writing the slices to standard output: {e}"))?;
    Ok(ExitCode::SUCCESS)
}
