//! Property tests: names round-trip through formatting and parsing, claim device names map back to
//! their claim, and every spec the store writes re-reads (as JSON and as YAML, as the runtimes
//! read it), validates, and declares exactly its minimum version.

use std::{fs, path::Path};

use cdi::{
    ClaimUid, ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice, QualifiedName, Spec,
    SpecStore, claim, claim_of_device, minimum_version, validate_spec,
};
use proptest::{collection::vec, option, prelude::*};

const VENDOR_RE: &str = "[A-Za-z]([A-Za-z0-9_.-]{0,30}[A-Za-z0-9])?";
const CLASS_RE: &str = "[A-Za-z]([A-Za-z0-9_.-]{0,30}[A-Za-z0-9])?";
const DEVICE_RE: &str = "[A-Za-z0-9]([A-Za-z0-9_.:-]{0,30}[A-Za-z0-9])?";
const UID_RE: &str = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";

fn uid() -> impl Strategy<Value = ClaimUid> {
    prop_oneof![
        // The shape Kubernetes generates.
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        UID_RE,
    ]
    .prop_map(|s| ClaimUid::new(&s).expect("the strategy makes valid uids"))
}

fn env_entry() -> impl Strategy<Value = String> {
    ("[A-Za-z_][A-Za-z0-9_]{0,8}", "[ -~]{0,16}").prop_map(|(k, v)| format!("{k}={v}"))
}

fn device_node() -> impl Strategy<Value = DeviceNode> {
    (
        "/dev/[a-z]{1,8}",
        prop_oneof![Just(String::new()), "/dev/[a-z]{1,8}"],
        prop::sample::select(vec!["", "b", "c", "u", "p"]),
        option::of(0i64..4096),
        option::of(0i64..4096),
        option::of(0u32..0o7777),
        prop::sample::select(vec!["", "none", "r", "rw", "rwm", "m"]),
        option::of(any::<u32>()),
        option::of(any::<u32>()),
    )
        .prop_map(
            |(path, host_path, kind, major, minor, file_mode, permissions, uid, gid)| DeviceNode {
                path,
                host_path,
                kind: kind.into(),
                major,
                minor,
                file_mode,
                permissions: permissions.into(),
                uid,
                gid,
            },
        )
}

fn mount() -> impl Strategy<Value = Mount> {
    (
        "/[a-z]{1,8}",
        "/[a-z]{1,8}",
        prop_oneof![
            Just(String::new()),
            Just("bind".to_string()),
            Just("tmpfs".to_string())
        ],
        vec("[a-z]{1,6}", 0..3),
    )
        .prop_map(|(host_path, container_path, kind, options)| Mount {
            host_path,
            container_path,
            kind,
            options,
        })
}

fn hook() -> impl Strategy<Value = Hook> {
    (
        prop::sample::select(cdi::validate::HOOK_NAMES.to_vec()),
        "/[a-z]{1,8}",
        vec("[a-z]{1,6}", 0..3),
        vec(env_entry(), 0..3),
        option::of(0i64..100),
    )
        .prop_map(|(name, path, args, env, timeout)| Hook {
            hook_name: name.into(),
            path,
            args,
            env,
            timeout,
        })
}

fn intel_rdt() -> impl Strategy<Value = IntelRdt> {
    (
        prop_oneof![Just(String::new()), Just("/".to_string()), "[a-z]{1,8}"],
        "[A-Z0-9:=;]{0,8}",
        "[A-Z0-9:=;]{0,8}",
        option::of(vec("[A-Z0-9:=;]{1,8}", 0..3)),
        any::<bool>(),
    )
        .prop_map(|(clos_id, l3, mb, schemata, enable_monitoring)| IntelRdt {
            clos_id,
            l3_cache_schema: l3,
            mem_bw_schema: mb,
            schemata,
            enable_monitoring,
        })
}

/// Valid, non-empty edits using any mix of fields.
fn edits() -> impl Strategy<Value = ContainerEdits> {
    (
        vec(env_entry(), 0..4),
        vec(device_node(), 0..3),
        0usize..3,
        vec(hook(), 0..2),
        vec(mount(), 0..3),
        option::weighted(0.3, intel_rdt()),
        vec(any::<u32>(), 0..3),
    )
        .prop_map(
            |(env, device_nodes, nets, hooks, mounts, intel_rdt, additional_gids)| ContainerEdits {
                env,
                device_nodes,
                // Unique on both sides, as validation requires.
                net_devices: (0..nets)
                    .map(|i| NetDevice {
                        host_interface_name: format!("eth{i}"),
                        name: format!("net{i}"),
                    })
                    .collect(),
                hooks,
                mounts,
                intel_rdt,
                additional_gids,
            },
        )
        .prop_filter("a device must change something", |e| !e.is_empty())
}

fn spec_file(dir: &Path, uid: &ClaimUid) -> Vec<u8> {
    fs::read(dir.join(claim::spec_file_name("resmgr.example.com", uid))).unwrap()
}

proptest! {
    #[test]
    fn qualified_names_round_trip(vendor in VENDOR_RE, class in CLASS_RE, name in DEVICE_RE) {
        let q = QualifiedName::new(&vendor, &class, &name).unwrap();
        let text = q.to_string();
        prop_assert_eq!(&text, &format!("{vendor}/{class}={name}"));
        prop_assert_eq!(QualifiedName::parse(&text), Ok(q));
    }

    #[test]
    fn any_string_that_parses_formats_back_to_itself(s in "[A-Za-z0-9_.:/=-]{0,24}") {
        if let Ok(q) = QualifiedName::parse(&s) {
            prop_assert_eq!(q.to_string(), s);
        }
    }

    #[test]
    fn claim_devices_map_back_to_their_claim(vendor in VENDOR_RE, uid in uid(), index in any::<usize>()) {
        let q = claim::qualified_device_name(&vendor, &uid, index).unwrap();
        let back = claim_of_device(&q.to_string()).unwrap();
        prop_assert_eq!(back.vendor, vendor);
        prop_assert_eq!(back.uid, uid);
        prop_assert_eq!(back.index, index);
    }

    #[test]
    fn a_valid_uid_is_one_plain_file_name_component(s in "[ -~]{0,70}") {
        if let Ok(uid) = ClaimUid::new(&s) {
            let name = claim::spec_file_name("resmgr.example.com", &uid);
            let path = Path::new(&name);
            prop_assert_eq!(path.components().count(), 1);
            prop_assert_eq!(path.file_name().and_then(|n| n.to_str()), Some(name.as_str()));
            prop_assert_eq!(claim::uid_of_spec_file("resmgr.example.com", &name), Some(uid));
        }
    }
}

proptest! {
    // Each case writes (and fsyncs) files; fewer cases keep the suite fast on a small machine.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_written_spec_rereads_validates_and_declares_its_minimum(
        uid in uid(),
        edits in vec(edits(), 1..5),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let store = SpecStore::new(tmp.path(), "resmgr.example.com").unwrap();

        let names = store.write_claim(uid.as_str(), &edits).unwrap();

        let data = spec_file(tmp.path(), &uid);
        let spec = Spec::from_json(&data).unwrap();
        prop_assert_eq!(&Spec::from_yaml(&data).unwrap(), &spec);
        prop_assert_eq!(validate_spec(&spec), Ok(()));
        prop_assert_eq!(spec.cdi_version.as_str(), minimum_version(&spec).as_str());
        prop_assert_eq!(spec.devices.len(), edits.len());
        for (i, ((device, edit), name)) in spec.devices.iter().zip(&edits).zip(&names).enumerate() {
            prop_assert_eq!(&device.container_edits, edit);
            prop_assert_eq!(name.name(), device.name.as_str());
            let back = claim_of_device(&name.to_string()).unwrap();
            prop_assert_eq!((back.uid, back.index), (uid.clone(), i));
        }
        prop_assert_eq!(store.claims().unwrap(), vec![uid]);
    }
}
