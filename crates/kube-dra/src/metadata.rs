//! Device metadata (KEP-5304): what a DRA driver tells the containers using a claim about the
//! devices they got, as a JSON file per claim and request that the runtime mounts into them.
//!
//! The protocol, as `k8s.io/dynamic-resource-allocation/api/metadata` and the kubelet plugin
//! helper define it:
//!
//! - **Where a container finds it** ([`container_path`]): under
//!   `/var/run/kubernetes.io/dra-device-attributes`, at
//!   `resourceclaims/<claim>/<request>/<driver>-metadata.json` for a claim the pod names, and at
//!   `resourceclaimtemplates/<podClaimName>/<request>/<driver>-metadata.json` for a claim made
//!   from a ResourceClaimTemplate (`podClaimName` is `pod.spec.resourceClaims[].name`, which the
//!   claim's `resource.kubernetes.io/pod-claim-name` annotation carries). `<request>` is the
//!   request's base name (`gpu` for `gpu/high-memory`); the file names the full one.
//! - **What it holds** ([`RequestMetadata::encode`]): a stream of JSON objects, the same
//!   `DeviceMetadata` once per API version, newest first; a reader takes the first it can
//!   decode. Each names the claim (`metadata.name`, `namespace`, `uid`, `generation`), its
//!   `podClaimName` when it has one, and one request with its devices: driver, pool, name and
//!   attributes in the ResourceSlice format (`{"int": 1}`, `{"string": "4-7"}`, ...).
//! - **Changes**: `metadata.generation` goes up whenever the content does.
//!
//! | version | written from | in |
//! |---|---|---|
//! | `metadata.resource.k8s.io/v1beta1` | Kubernetes 1.37 (beta) | [`MetadataVersion::V1beta1`] |
//! | `metadata.resource.k8s.io/v1alpha1` | 1.36 (alpha) | [`MetadataVersion::V1alpha1`] |
//!
//! The two versions have the same fields. Nothing here does IO: where the file lies on the host
//! and how it is written and mounted is the driver's business (resmgr's `metadata`).

use std::{collections::BTreeMap, fmt, str::FromStr};

use k8s_openapi::api::resource::v1 as wire;
use policy::AttributeValue;
use serde::{Deserialize, Serialize};

use crate::slices::build::wire_attribute;

/// Where metadata files appear inside a container.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The subdirectory of claims a pod names, by the claim's name.
pub const RESOURCE_CLAIMS_SUBDIR: &str = "resourceclaims";
/// The subdirectory of claims made from a template, by the pod's name for the claim.
pub const RESOURCE_CLAIM_TEMPLATES_SUBDIR: &str = "resourceclaimtemplates";
/// What follows the driver's name in a metadata file's name.
pub const FILE_SUFFIX: &str = "-metadata.json";
/// The API group of the metadata objects.
pub const GROUP: &str = "metadata.resource.k8s.io";
/// The kind of the metadata objects.
pub const KIND: &str = "DeviceMetadata";

/// A version of the metadata API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetadataVersion {
    /// `metadata.resource.k8s.io/v1beta1`, Kubernetes 1.37.
    V1beta1,
    /// `metadata.resource.k8s.io/v1alpha1`, Kubernetes 1.36.
    V1alpha1,
}

impl MetadataVersion {
    /// Every version, newest first: what a file carries by default.
    pub const ALL: [Self; 2] = [Self::V1beta1, Self::V1alpha1];

    /// The version's name, `v1beta1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1beta1 => "v1beta1",
            Self::V1alpha1 => "v1alpha1",
        }
    }

    /// The object's `apiVersion`, `metadata.resource.k8s.io/v1beta1`.
    pub fn api_version(self) -> String {
        format!("{GROUP}/{}", self.as_str())
    }
}

impl fmt::Display for MetadataVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no metadata version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a device metadata version (v1beta1 or v1alpha1)")]
pub struct UnknownVersion(pub String);

impl FromStr for MetadataVersion {
    type Err = UnknownVersion;

    /// `v1beta1` or `metadata.resource.k8s.io/v1beta1`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bare = s
            .strip_prefix(GROUP)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(s);
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == bare)
            .ok_or_else(|| UnknownVersion(s.to_owned()))
    }
}

/// One metadata file: a claim's request and the devices allocated to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMetadata {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
    /// Goes up whenever the content does; 1 at first.
    pub generation: i64,
    /// The name the pod gives a claim made from a template.
    pub pod_claim_name: Option<String>,
    /// The request, with its subrequest when it has one (`gpu/high-memory`).
    pub request: String,
    /// The devices allocated to it, in the claim's order.
    pub devices: Vec<DeviceMetadata>,
}

/// A device allocated to a request, as a container reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMetadata {
    /// The driver that publishes it.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its name in the pool.
    pub name: String,
    /// Its attributes by qualified name (bare names are in the driver's domain).
    pub attributes: BTreeMap<String, AttributeValue>,
}

/// What cannot be read back from a metadata file.
#[derive(Debug, thiserror::Error)]
pub enum MetadataDecodeError {
    /// An object of the stream is not JSON.
    #[error("object {index} of the stream is not json")]
    Json {
        /// Its position in the stream.
        index: usize,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// No object of the stream is of a version this reader knows.
    #[error("no object of a known version ({}) in the stream; found {found:?}", MetadataVersion::ALL.map(MetadataVersion::as_str).join(", "))]
    NoKnownVersion {
        /// The `apiVersion` and `kind` of each object found.
        found: Vec<String>,
    },
    /// The first object of a known version does not have the fields of its version.
    #[error("the {version} object does not decode")]
    Fields {
        /// Its version.
        version: MetadataVersion,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// An attribute holds a value of a type the domain has none of.
    #[error("device {device}: attribute {attribute}: {reason}")]
    Attribute {
        /// The device.
        device: String,
        /// The attribute.
        attribute: String,
        /// What its value is.
        reason: String,
    },
}

impl RequestMetadata {
    /// The file's content: one object per version in `versions`, in that order (newest first,
    /// as readers take the first they know), each on its lines and ended by a newline.
    pub fn encode(&self, versions: &[MetadataVersion]) -> Vec<u8> {
        let mut out = Vec::new();
        for version in versions {
            let document = Document {
                kind: KIND.to_owned(),
                api_version: version.api_version(),
                metadata: ObjectMeta {
                    name: self.name.clone(),
                    namespace: self.namespace.clone(),
                    uid: self.uid.clone(),
                    generation: self.generation,
                },
                pod_claim_name: self.pod_claim_name.clone(),
                requests: vec![WireRequest {
                    name: self.request.clone(),
                    devices: self
                        .devices
                        .iter()
                        .map(|d| WireDevice {
                            driver: d.driver.clone(),
                            pool: d.pool.clone(),
                            name: d.name.clone(),
                            attributes: d
                                .attributes
                                .iter()
                                .map(|(name, value)| (name.clone(), wire_attribute(value)))
                                .collect(),
                        })
                        .collect(),
                }],
            };
            // Serializing plain structs of strings, numbers and maps cannot fail.
            if let Ok(json) = serde_json::to_vec_pretty(&document) {
                out.extend_from_slice(&json);
                out.push(b'\n');
            }
        }
        out
    }

    /// The first object of `data` whose version this reader knows, as a reader in the container
    /// takes it; objects of other versions are skipped.
    pub fn decode(data: &[u8]) -> Result<Self, MetadataDecodeError> {
        let mut found = Vec::new();
        let stream = serde_json::Deserializer::from_slice(data).into_iter::<serde_json::Value>();
        for (index, object) in stream.enumerate() {
            let object = object.map_err(|source| MetadataDecodeError::Json { index, source })?;
            let api_version = object
                .get("apiVersion")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            let kind = object
                .get("kind")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            let version = match api_version.parse::<MetadataVersion>() {
                Ok(version) if api_version.starts_with(GROUP) && kind == KIND => version,
                _ => {
                    found.push(format!("{api_version} {kind}"));
                    continue;
                }
            };
            let document: Document = serde_json::from_value(object)
                .map_err(|source| MetadataDecodeError::Fields { version, source })?;
            return Self::from_document(document);
        }
        Err(MetadataDecodeError::NoKnownVersion { found })
    }

    fn from_document(document: Document) -> Result<Self, MetadataDecodeError> {
        let request = document.requests.into_iter().next().unwrap_or_default();
        let devices = request
            .devices
            .into_iter()
            .map(|d| {
                let attributes = d
                    .attributes
                    .into_iter()
                    .map(|(name, value)| {
                        domain_attribute(&value)
                            .map(|v| (name.clone(), v))
                            .map_err(|reason| MetadataDecodeError::Attribute {
                                device: d.name.clone(),
                                attribute: name,
                                reason,
                            })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(DeviceMetadata {
                    driver: d.driver,
                    pool: d.pool,
                    name: d.name,
                    attributes,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            namespace: document.metadata.namespace,
            name: document.metadata.name,
            uid: document.metadata.uid,
            generation: document.metadata.generation,
            pod_claim_name: document.pod_claim_name,
            request: request.name,
            devices,
        })
    }
}

/// Where a container finds the metadata `driver` writes for `request` of a claim: see the
/// module docs. `pod_claim_name` is the claim's when the controller made it from a template.
pub fn container_path(
    driver: &str,
    claim_name: &str,
    pod_claim_name: Option<&str>,
    request: &str,
) -> String {
    let (subdir, claim) = match pod_claim_name {
        Some(pod_claim) => (RESOURCE_CLAIM_TEMPLATES_SUBDIR, pod_claim),
        None => (RESOURCE_CLAIMS_SUBDIR, claim_name),
    };
    format!(
        "{CONTAINER_DIR}/{subdir}/{claim}/{}/{driver}{FILE_SUFFIX}",
        base_request(request)
    )
}

/// `gpu/high-memory` → `gpu`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

fn domain_attribute(value: &wire::DeviceAttribute) -> Result<AttributeValue, String> {
    let one = match value {
        wire::DeviceAttribute { int: Some(i), .. } => AttributeValue::Int(*i),
        wire::DeviceAttribute { bool: Some(b), .. } => AttributeValue::Bool(*b),
        wire::DeviceAttribute {
            string: Some(s), ..
        } => AttributeValue::String(s.clone()),
        wire::DeviceAttribute {
            version: Some(v), ..
        } => AttributeValue::Version(v.clone()),
        wire::DeviceAttribute {
            strings: Some(list),
            ..
        } => AttributeValue::Strings(list.clone()),
        wire::DeviceAttribute {
            ints: Some(list), ..
        } => AttributeValue::Ints(list.clone()),
        _ => return Err("no value of a type this reader knows".to_owned()),
    };
    Ok(one)
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    kind: String,
    api_version: String,
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<String>,
    #[serde(default)]
    requests: Vec<WireRequest>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ObjectMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    generation: i64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct WireRequest {
    name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    devices: Vec<WireDevice>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireDevice {
    driver: String,
    pool: String,
    name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attributes: BTreeMap<String, wire::DeviceAttribute>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RequestMetadata {
        RequestMetadata {
            namespace: "default".into(),
            name: "cpus-abc12".into(),
            uid: "0b2c9a5e-8f6d-4c1a-9e3b-2d7f1a6c4e80".into(),
            generation: 1,
            pod_claim_name: Some("cpus".into()),
            request: "cpus/big".into(),
            devices: vec![DeviceMetadata {
                driver: "topology-aware.resmgr.io".into(),
                pool: "node-a".into(),
                name: "numa1".into(),
                attributes: BTreeMap::from([
                    (
                        "resource.kubernetes.io/numaNode".to_owned(),
                        AttributeValue::Int(1),
                    ),
                    (
                        "grantedCpus".to_owned(),
                        AttributeValue::String("4-7".into()),
                    ),
                    (
                        "grantedCpuIDs".to_owned(),
                        AttributeValue::Ints(vec![4, 5, 6, 7]),
                    ),
                ]),
            }],
        }
    }

    #[test]
    fn the_stream_holds_one_object_per_version_newest_first_and_reads_back() {
        let data = sample().encode(&MetadataVersion::ALL);
        let objects: Vec<serde_json::Value> = serde_json::Deserializer::from_slice(&data)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        let versions: Vec<&str> = objects
            .iter()
            .map(|o| o["apiVersion"].as_str().unwrap())
            .collect();
        assert_eq!(
            versions,
            [
                "metadata.resource.k8s.io/v1beta1",
                "metadata.resource.k8s.io/v1alpha1"
            ]
        );
        let first = &objects[0];
        assert_eq!(first["kind"], "DeviceMetadata");
        assert_eq!(first["metadata"]["generation"], 1);
        assert_eq!(first["podClaimName"], "cpus");
        assert_eq!(first["requests"][0]["name"], "cpus/big");
        let device = &first["requests"][0]["devices"][0];
        assert_eq!(device["pool"], "node-a");
        assert_eq!(
            device["attributes"]["resource.kubernetes.io/numaNode"],
            serde_json::json!({"int": 1})
        );
        assert_eq!(
            device["attributes"]["grantedCpuIDs"],
            serde_json::json!({"ints": [4, 5, 6, 7]})
        );
        assert_eq!(RequestMetadata::decode(&data).unwrap(), sample());
    }

    #[test]
    fn a_reader_skips_versions_it_does_not_know() {
        let mut data =
            br#"{"apiVersion": "metadata.resource.k8s.io/v2", "kind": "DeviceMetadata"}"#.to_vec();
        data.extend(sample().encode(&[MetadataVersion::V1alpha1]));
        assert_eq!(RequestMetadata::decode(&data).unwrap(), sample());
        let err =
            RequestMetadata::decode(b"{\"apiVersion\": \"v1\", \"kind\": \"Pod\"}").unwrap_err();
        assert!(err.to_string().contains("v1 Pod"), "{err}");
        assert!(matches!(
            RequestMetadata::decode(b"{nope"),
            Err(MetadataDecodeError::Json { index: 0, .. })
        ));
    }

    #[test]
    fn paths_follow_the_claim_or_the_pods_name_for_it_and_the_base_request() {
        assert_eq!(
            container_path("topology-aware.resmgr.io", "db-cpus", None, "cpus"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/db-cpus/cpus/topology-aware.resmgr.io-metadata.json"
        );
        assert_eq!(
            container_path("d.io", "web-0-cpus-x7k2p", Some("cpus"), "cpus/big"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/cpus/cpus/d.io-metadata.json"
        );
    }

    #[test]
    fn versions_parse_bare_or_qualified() {
        assert_eq!("v1beta1".parse(), Ok(MetadataVersion::V1beta1));
        assert_eq!(
            "metadata.resource.k8s.io/v1alpha1".parse(),
            Ok(MetadataVersion::V1alpha1)
        );
        assert!("v1".parse::<MetadataVersion>().is_err());
    }
}
