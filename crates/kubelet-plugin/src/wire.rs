//! The DRA wire types (v1 and v1beta1) to and from the handler's types, and request validation.
//!
//! This is the only place that knows both versions exist. v1 and v1beta1 differ in one field:
//! v1's `Device.share_id`, which v1beta1 cannot carry and so drops.

use std::collections::{BTreeMap, HashSet};

use dra_proto::{v1, v1beta1};
use tonic::Status;
use tracing::{debug, warn};

use crate::handler::{ClaimError, ClaimRef, PreparedDevice};

impl From<v1::Claim> for ClaimRef {
    fn from(c: v1::Claim) -> Self {
        Self {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        }
    }
}

impl From<v1beta1::Claim> for ClaimRef {
    fn from(c: v1beta1::Claim) -> Self {
        Self {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        }
    }
}

/// Checks a request's claims: every field present, no UID twice (the response is a map by UID,
/// so a repeated UID could not be answered twice). A failure is `InvalidArgument` naming the
/// claim by its position in the request.
pub(crate) fn validate_claims(claims: &[ClaimRef]) -> Result<(), Status> {
    let mut uids = HashSet::with_capacity(claims.len());
    for (i, claim) in claims.iter().enumerate() {
        for (field, value) in [
            ("namespace", &claim.namespace),
            ("uid", &claim.uid),
            ("name", &claim.name),
        ] {
            if value.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "claim {i} of the request has an empty {field}"
                )));
            }
        }
        if !uids.insert(claim.uid.as_str()) {
            return Err(Status::invalid_argument(format!(
                "claim {i} of the request repeats uid {:?}",
                claim.uid
            )));
        }
    }
    Ok(())
}

/// Pairs each requested claim with the handler's answer for it, in request order. The kubelet
/// fails the whole call when a requested UID is missing or an unrequested one appears, so a
/// claim the handler left out gets an error of its own and extra answers are dropped (both are
/// handler bugs, logged).
pub(crate) fn answers<T>(
    operation: &str,
    requested: &[ClaimRef],
    mut results: BTreeMap<String, Result<T, ClaimError>>,
) -> Vec<(String, Result<T, ClaimError>)> {
    let answered = requested
        .iter()
        .map(|claim| {
            let answer = results.remove(&claim.uid).unwrap_or_else(|| {
                warn!(
                    operation,
                    claim = %format_args!("{}/{}", claim.namespace, claim.name),
                    uid = %claim.uid,
                    "the claim handler gave no answer for a requested claim"
                );
                Err(ClaimError::new(format!(
                    "{operation} of claim {}/{} ({}) got no answer from the driver",
                    claim.namespace, claim.name, claim.uid
                )))
            });
            (claim.uid.clone(), answer)
        })
        .collect();
    for uid in results.keys() {
        warn!(operation, %uid, "the claim handler answered a claim that was not requested; dropped");
    }
    answered
}

pub(crate) fn prepare_v1(
    answers: Vec<(String, Result<Vec<PreparedDevice>, ClaimError>)>,
) -> v1::NodePrepareResourcesResponse {
    let claims = answers
        .into_iter()
        .map(|(uid, answer)| {
            let response = match answer {
                Ok(devices) => v1::NodePrepareResourceResponse {
                    devices: devices.into_iter().map(device_v1).collect(),
                    error: String::new(),
                },
                Err(e) => v1::NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error: e.message,
                },
            };
            (uid, response)
        })
        .collect();
    v1::NodePrepareResourcesResponse { claims }
}

pub(crate) fn prepare_v1beta1(
    answers: Vec<(String, Result<Vec<PreparedDevice>, ClaimError>)>,
) -> v1beta1::NodePrepareResourcesResponse {
    let claims = answers
        .into_iter()
        .map(|(uid, answer)| {
            let response = match answer {
                Ok(devices) => v1beta1::NodePrepareResourceResponse {
                    devices: devices.into_iter().map(device_v1beta1).collect(),
                    error: String::new(),
                },
                Err(e) => v1beta1::NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error: e.message,
                },
            };
            (uid, response)
        })
        .collect();
    v1beta1::NodePrepareResourcesResponse { claims }
}

pub(crate) fn unprepare_v1(
    answers: Vec<(String, Result<(), ClaimError>)>,
) -> v1::NodeUnprepareResourcesResponse {
    let claims = answers
        .into_iter()
        .map(|(uid, answer)| {
            let error = answer.err().map(|e| e.message).unwrap_or_default();
            (uid, v1::NodeUnprepareResourceResponse { error })
        })
        .collect();
    v1::NodeUnprepareResourcesResponse { claims }
}

pub(crate) fn unprepare_v1beta1(
    answers: Vec<(String, Result<(), ClaimError>)>,
) -> v1beta1::NodeUnprepareResourcesResponse {
    let claims = answers
        .into_iter()
        .map(|(uid, answer)| {
            let error = answer.err().map(|e| e.message).unwrap_or_default();
            (uid, v1beta1::NodeUnprepareResourceResponse { error })
        })
        .collect();
    v1beta1::NodeUnprepareResourcesResponse { claims }
}

fn device_v1(d: PreparedDevice) -> v1::Device {
    v1::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
    }
}

fn device_v1beta1(d: PreparedDevice) -> v1beta1::Device {
    if let Some(share) = &d.share_id {
        // Only kubelets that speak v1 (1.34+) allocate shares; one speaking v1beta1 to us
        // cannot have asked for one, so this is worth a note, not an error.
        debug!(pool = %d.pool, device = %d.device, share = %share, "v1beta1 cannot carry a share id; dropped");
    }
    v1beta1::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            uid: uid.into(),
            name: format!("claim-{uid}"),
        }
    }

    #[test]
    fn empty_fields_are_invalid_argument_naming_field_and_position() {
        for (field, broken) in [
            (
                "namespace",
                ClaimRef {
                    namespace: String::new(),
                    ..claim("b")
                },
            ),
            (
                "uid",
                ClaimRef {
                    uid: String::new(),
                    ..claim("b")
                },
            ),
            (
                "name",
                ClaimRef {
                    name: String::new(),
                    ..claim("b")
                },
            ),
        ] {
            let err = validate_claims(&[claim("a"), broken]).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            assert_eq!(
                err.message(),
                format!("claim 1 of the request has an empty {field}")
            );
        }
    }

    #[test]
    fn repeated_uids_are_invalid_argument() {
        let err = validate_claims(&[claim("a"), claim("b"), claim("a")]).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("claim 2"), "{}", err.message());
    }

    #[test]
    fn valid_claims_pass() {
        assert!(validate_claims(&[claim("a"), claim("b")]).is_ok());
        assert!(validate_claims(&[]).is_ok());
    }

    #[test]
    fn missing_answers_become_claim_errors_and_extra_answers_are_dropped() {
        let requested = [claim("a"), claim("b")];
        let results = BTreeMap::from([("a".to_owned(), Ok(())), ("zzz".to_owned(), Ok(()))]);
        let answered = answers("prepare", &requested, results);
        assert_eq!(answered.len(), 2);
        assert_eq!(answered[0], ("a".to_owned(), Ok(())));
        assert_eq!(answered[1].0, "b");
        let err = answered[1].1.clone().unwrap_err();
        assert!(err.message.contains("ns/claim-b (b)"), "{}", err.message);
    }

    #[test]
    fn v1_carries_share_id_and_v1beta1_drops_it() {
        let device = PreparedDevice {
            request_names: vec!["req".into()],
            pool: "pool".into(),
            device: "dev".into(),
            cdi_device_ids: vec!["resmgr.example.com/claim=x".into()],
            share_id: Some("share-1".into()),
        };
        let answers = vec![("u".to_owned(), Ok(vec![device]))];
        let v1 = prepare_v1(answers.clone());
        let d = &v1.claims["u"].devices[0];
        assert_eq!(d.share_id.as_deref(), Some("share-1"));
        assert_eq!(
            (d.pool_name.as_str(), d.device_name.as_str()),
            ("pool", "dev")
        );
        let beta = prepare_v1beta1(answers);
        let d = &beta.claims["u"].devices[0];
        assert_eq!(d.request_names, ["req"]);
        assert_eq!(d.cdi_device_ids, ["resmgr.example.com/claim=x"]);
    }

    #[test]
    fn claim_errors_carry_the_message_and_no_devices() {
        let answers = vec![("u".to_owned(), Err(ClaimError::new("no CPUs left")))];
        let v1 = prepare_v1(answers.clone());
        assert_eq!(v1.claims["u"].error, "no CPUs left");
        assert!(v1.claims["u"].devices.is_empty());
        let un = unprepare_v1beta1(vec![("u".to_owned(), Err(ClaimError::new("busy")))]);
        assert_eq!(un.claims["u"].error, "busy");
    }
}
