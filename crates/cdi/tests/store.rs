//! The spec store against a real temporary directory: what it writes, what it refuses, what it
//! lists, and that a concurrent reader never sees a half-written spec.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
};

use cdi::{
    ClaimUid, ContainerEdits, DeviceNode, Spec, SpecStore, StoreError, UidError, ValidationError,
    Version, claim_of_device, validate_spec,
};

const VENDOR: &str = "resmgr.example.com";
const UUID: &str = "0b2c9a5e-8f6d-4c1a-9e3b-2d7f1a6c4e80";

fn env(entries: &[&str]) -> ContainerEdits {
    ContainerEdits::with_env(entries.iter().map(|e| e.to_string()))
}

fn store(dir: &Path) -> SpecStore {
    SpecStore::new(dir, VENDOR).unwrap()
}

fn read_spec(path: &Path) -> Spec {
    Spec::from_json(&fs::read(path).unwrap()).unwrap()
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn write_claim_writes_one_device_per_edit_and_returns_their_names_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    let edits = [env(&["CLAIM_0=a"]), env(&["CLAIM_1=b", "X=1"])];

    let names = store.write_claim(UUID, &edits).unwrap();

    let names: Vec<String> = names.iter().map(ToString::to_string).collect();
    assert_eq!(
        names,
        [
            format!("{VENDOR}/device=claim-{UUID}-0"),
            format!("{VENDOR}/device=claim-{UUID}-1")
        ]
    );
    let file = format!("{VENDOR}-device_{UUID}.json");
    assert_eq!(
        dir_entries(tmp.path()),
        std::slice::from_ref(&file),
        "exactly the spec, no temporary file"
    );
    let path = tmp.path().join(&file);
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );

    let spec = read_spec(&path);
    assert_eq!(validate_spec(&spec), Ok(()));
    assert_eq!(spec.kind, format!("{VENDOR}/device"));
    // The UID starts with a digit, the device name does not: the baseline version suffices.
    assert_eq!(spec.cdi_version, "0.3.0");
    assert_eq!(spec.devices.len(), 2);
    for (i, (device, edit)) in spec.devices.iter().zip(&edits).enumerate() {
        assert_eq!(device.name, format!("claim-{UUID}-{i}"));
        assert_eq!(&device.container_edits, edit);
    }
    assert!(spec.container_edits.is_empty());
    assert_eq!(spec, store.spec_for(&ClaimUid::new(UUID).unwrap(), &edits));
}

#[test]
fn the_written_version_is_the_minimum_the_edits_need() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    let node = ContainerEdits {
        device_nodes: vec![DeviceNode {
            path: "/dev/x".into(),
            host_path: "/dev/null".into(),
            ..DeviceNode::default()
        }],
        ..ContainerEdits::default()
    };
    store
        .write_claim("claim-a", &[env(&["A=1"]), node])
        .unwrap();
    let spec = read_spec(&tmp.path().join(format!("{VENDOR}-device_claim-a.json")));
    assert_eq!(spec.cdi_version, Version::V0_5_0.as_str());
}

#[test]
fn write_claim_replaces_the_previous_spec_of_the_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    store
        .write_claim(UUID, &[env(&["A=1"]), env(&["B=1"])])
        .unwrap();
    let names = store.write_claim(UUID, &[env(&["C=1"])]).unwrap();

    assert_eq!(names.len(), 1);
    assert_eq!(dir_entries(tmp.path()).len(), 1);
    let spec = read_spec(&store.spec_path(&ClaimUid::new(UUID).unwrap()));
    assert_eq!(spec.devices.len(), 1);
    assert_eq!(spec.devices[0].container_edits.env, ["C=1"]);
}

#[test]
fn write_claim_refuses_an_empty_uid_no_edits_and_invalid_edits_without_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());

    assert!(matches!(
        store.write_claim("", &[env(&["A=1"])]),
        Err(StoreError::Uid(UidError::Empty))
    ));
    assert!(matches!(
        store.write_claim(UUID, &[]),
        Err(StoreError::NoEdits { uid }) if uid.as_str() == UUID
    ));
    let err = store
        .write_claim(UUID, &[env(&["A=1"]), env(&["NOEQUALS"])])
        .unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::Invalid { source: ValidationError::Env { field, value }, .. }
                if field == "devices[1].containerEdits.env[0]" && value == "NOEQUALS"
        ),
        "{err:?}"
    );
    assert!(matches!(
        store.write_claim(UUID, &[env(&["A=1"]), ContainerEdits::default()]),
        Err(StoreError::Invalid { source: ValidationError::EmptyDeviceEdits { field }, .. })
            if field == "devices[1].containerEdits"
    ));
    assert_eq!(dir_entries(tmp.path()), Vec::<String>::new());
}

#[test]
fn write_claim_creates_a_missing_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("var/run/cdi");
    let store = store(&dir);
    store.write_claim(UUID, &[env(&["A=1"])]).unwrap();
    assert!(store.has_claim(UUID).unwrap());
}

#[test]
fn remove_claim_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    store.write_claim(UUID, &[env(&["A=1"])]).unwrap();
    assert!(store.has_claim(UUID).unwrap());

    assert!(store.remove_claim(UUID).unwrap(), "the spec was there");
    assert!(!store.has_claim(UUID).unwrap());
    assert_eq!(dir_entries(tmp.path()), Vec::<String>::new());
    assert!(
        !store.remove_claim(UUID).unwrap(),
        "a missing spec is success"
    );

    let missing = SpecStore::new(tmp.path().join("missing"), VENDOR).unwrap();
    assert!(
        !missing.remove_claim(UUID).unwrap(),
        "a missing directory is success"
    );
    assert_eq!(missing.claims().unwrap(), []);
}

#[test]
fn claims_lists_only_this_vendors_spec_files() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    store.write_claim("b-2", &[env(&["A=1"])]).unwrap();
    store.write_claim(UUID, &[env(&["A=1"])]).unwrap();
    store.write_claim("a-1", &[env(&["A=1"])]).unwrap();
    let strays = [
        format!(".{VENDOR}-device_c-3.json.Ab12Cd.tmp"),
        format!("{VENDOR}-device_d-4.json.tmp"),
        format!("{VENDOR}-device_e-5.yaml"),
        format!("{VENDOR}-gpu_f-6.json"),
        "other.example.com-device_g-7.json".into(),
        format!("{VENDOR}-device_bad_uid.json"),
        "spec.123.tmp".into(),
    ];
    for name in &strays {
        fs::write(tmp.path().join(name), "{}").unwrap();
    }
    fs::create_dir(tmp.path().join(format!("{VENDOR}-device_h-8.json"))).unwrap();

    let claims: Vec<String> = store
        .claims()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(claims, [UUID, "a-1", "b-2"], "sorted");
}

#[test]
fn remove_temporary_files_removes_only_our_temporary_files() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    store.write_claim(UUID, &[env(&["A=1"])]).unwrap();
    let ours = format!(".{VENDOR}-device_{UUID}.json.Ab12Cd.tmp");
    let theirs = format!(".other.example.com-device_{UUID}.json.Ab12Cd.tmp");
    fs::write(tmp.path().join(&ours), "{").unwrap();
    fs::write(tmp.path().join(&theirs), "{").unwrap();

    assert_eq!(store.remove_temporary_files().unwrap(), 1);
    assert_eq!(
        dir_entries(tmp.path()),
        [theirs, format!("{VENDOR}-device_{UUID}.json")]
    );
}

#[test]
fn uids_that_try_to_escape_the_directory_are_refused_before_any_path_is_built() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cdi");
    fs::create_dir(&dir).unwrap();
    // A file a traversal would reach: `<dir>/<vendor>-device_../../victim.json` resolves to
    // `<root>/victim.json` if `<vendor>-device_..` were a directory; `../victim` variants aim at
    // it directly.
    let victim = root.path().join("victim.json");
    fs::write(&victim, "keep").unwrap();
    fs::create_dir(dir.join(format!("{VENDOR}-device_.."))).unwrap();
    let store = store(&dir);

    for uid in [
        "..",
        "../victim",
        "../../victim",
        "/../../victim",
        "a/../../../victim",
        &format!("/{}", root.path().join("victim").display()),
        "victim\0",
        "a b",
        ".",
        "",
        &"a".repeat(64),
    ] {
        let is_uid_error = |r: Result<_, StoreError>| matches!(r, Err(StoreError::Uid(_)));
        assert!(
            is_uid_error(store.write_claim(uid, &[env(&["A=1"])]).map(|_| ())),
            "write {uid:?}"
        );
        assert!(
            is_uid_error(store.remove_claim(uid).map(|_| ())),
            "remove {uid:?}"
        );
        assert!(
            is_uid_error(store.has_claim(uid).map(|_| ())),
            "has {uid:?}"
        );
    }
    assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
    assert_eq!(dir_entries(root.path()), ["cdi", "victim.json"]);
    assert_eq!(dir_entries(&dir), [format!("{VENDOR}-device_..")]);
}

#[test]
fn the_store_refuses_vendors_that_are_invalid_or_too_long_for_file_names() {
    assert!(matches!(
        SpecStore::new("/x", "-bad"),
        Err(StoreError::Vendor(_))
    ));
    assert!(matches!(
        SpecStore::new("/x", "a/b"),
        Err(StoreError::Vendor(_))
    ));
    assert!(matches!(
        SpecStore::new("/x", &"a".repeat(254)),
        Err(StoreError::Vendor(_))
    ));
    let max = cdi::store::MAX_STORE_VENDOR_LEN;
    assert!(SpecStore::new("/x", &"a".repeat(max)).is_ok());
    assert!(matches!(
        SpecStore::new("/x", &"a".repeat(max + 1)),
        Err(StoreError::VendorTooLong { .. })
    ));
}

#[test]
fn the_longest_vendor_and_uid_still_make_writable_file_names() {
    let tmp = tempfile::tempdir().unwrap();
    let vendor = "v".repeat(cdi::store::MAX_STORE_VENDOR_LEN);
    let store = SpecStore::new(tmp.path(), &vendor).unwrap();
    let uid = "u".repeat(cdi::claim::MAX_UID_LEN);
    let names = store.write_claim(&uid, &[env(&["A=1"])]).unwrap();
    assert_eq!(store.claims().unwrap(), [ClaimUid::new(&uid).unwrap()]);
    let device = claim_of_device(&names[0].to_string()).unwrap();
    assert_eq!(
        (device.vendor.as_str(), device.uid.as_str(), device.index),
        (vendor.as_str(), uid.as_str(), 0)
    );
}

/// A temporary directory on tmpfs when the machine has one, as `/var/run/cdi` is in production:
/// there an fsync costs nothing, so 1,000 rewrites take milliseconds instead of seconds on a
/// virtual disk, and the test is about visibility, not durability.
fn tmpfs_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().unwrap()
}

/// What the reader thread reports after each look at the directory: the generation it read.
type Seen = u64;

#[test]
fn a_reader_never_sees_a_half_written_spec_during_1000_rewrites() {
    const REWRITES: u64 = 1000;
    /// The writer waits for the reader to see its latest generation this often, so the reader's
    /// looks are spread over the whole run rather than bunched at one end.
    const HANDSHAKE_EVERY: u64 = 25;

    let tmp = tmpfs_dir();
    let store = store(tmp.path());
    // Large enough (about 20 KB) that a non-atomic write would be caught mid-way.
    let edits_for = |generation: u64| -> Vec<ContainerEdits> {
        let devices = 1 + generation % 8;
        (0..devices)
            .map(|d| {
                let mut entries = vec![format!("GENERATION={generation}")];
                entries.extend((0..40).map(|k| format!("PAD_{d}_{k}={:064}", generation)));
                ContainerEdits::with_env(entries)
            })
            .collect()
    };
    store.write_claim(UUID, &edits_for(0)).unwrap();
    let spec_name = format!("{VENDOR}-device_{UUID}.json");

    let done = Arc::new(AtomicBool::new(false));
    let (seen_tx, seen_rx) = mpsc::channel::<Seen>();
    let reader = {
        let (store, done, dir) = (store.clone(), done.clone(), tmp.path().to_path_buf());
        let spec_name = spec_name.clone();
        thread::spawn(move || -> Result<usize, String> {
            let mut last = 0;
            let mut looks = 0;
            loop {
                let finished = done.load(Ordering::Acquire);
                let claims = store.claims().map_err(|e| format!("claims: {e}"))?;
                if claims.len() != 1 || claims[0].as_str() != UUID {
                    return Err(format!("claims() reported {claims:?}"));
                }
                // As a runtime scans: every `.json` file in the directory.
                let mut found = false;
                for entry in fs::read_dir(&dir).map_err(|e| e.to_string())? {
                    let name = entry.map_err(|e| e.to_string())?.file_name();
                    let name = name.to_string_lossy();
                    if !name.ends_with(".json") {
                        continue;
                    }
                    if name != spec_name {
                        return Err(format!("unexpected spec file {name}"));
                    }
                    found = true;
                    let data = fs::read(dir.join(&*name)).map_err(|e| format!("read: {e}"))?;
                    let spec = Spec::from_json(&data)
                        .map_err(|e| format!("half-written spec ({} bytes): {e}", data.len()))?;
                    validate_spec(&spec).map_err(|e| format!("invalid spec: {e}"))?;
                    let generation = spec.devices[0].container_edits.env[0]
                        .strip_prefix("GENERATION=")
                        .and_then(|g| g.parse::<u64>().ok())
                        .ok_or("no generation")?;
                    if generation < last {
                        return Err(format!("generation went back from {last} to {generation}"));
                    }
                    if spec.devices.len() as u64 != 1 + generation % 8 {
                        return Err(format!(
                            "generation {generation} has {} devices",
                            spec.devices.len()
                        ));
                    }
                    last = generation;
                }
                if !found {
                    return Err("the spec was missing".into());
                }
                looks += 1;
                if seen_tx.send(last).is_err() || finished {
                    return Ok(looks);
                }
            }
        })
    };

    for generation in 1..=REWRITES {
        store.write_claim(UUID, &edits_for(generation)).unwrap();
        if generation % HANDSHAKE_EVERY == 0 {
            // Wait until the reader has seen this generation (or has stopped on an error).
            while let Ok(seen) = seen_rx.recv() {
                if seen >= generation {
                    break;
                }
            }
        }
    }
    done.store(true, Ordering::Release);
    let looks = reader.join().expect("reader thread panicked");
    let looks = looks.unwrap_or_else(|e| panic!("the reader saw a broken spec directory: {e}"));
    assert!(
        looks as u64 >= REWRITES / HANDSHAKE_EVERY,
        "the reader looked only {looks} times"
    );
    assert_eq!(
        dir_entries(tmp.path()),
        [spec_name],
        "no temporary file is left behind"
    );
}

#[test]
fn the_store_and_the_uid_report_what_they_were_made_with() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    assert_eq!(store.vendor(), VENDOR);
    assert_eq!(store.dir(), tmp.path());
    let uid = ClaimUid::new(UUID).unwrap();
    assert_eq!(uid.as_ref(), UUID);
    assert_eq!(
        store.spec_path(&uid),
        tmp.path().join(format!("{VENDOR}-device_{UUID}.json"))
    );
}

/// Only a missing file or directory is "nothing there"; any other failure is an error naming
/// the path, never mistaken for an empty store (start-up reconciliation relies on the listing).
#[test]
fn failures_other_than_not_found_are_errors_naming_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    // The spec directory is a regular file: every path under it fails with ENOTDIR.
    let not_a_dir = tmp.path().join("cdi");
    fs::write(&not_a_dir, b"").unwrap();
    let store = store(&not_a_dir);
    let err = store.claims().unwrap_err();
    assert!(
        matches!(&err, StoreError::Io { path, .. } if path == &not_a_dir),
        "{err:?}"
    );
    let err = store.has_claim(UUID).unwrap_err();
    assert!(
        matches!(&err, StoreError::Io { path, .. } if path.starts_with(&not_a_dir)),
        "{err:?}"
    );

    // Something that is not a file where a claim's spec would be cannot be removed.
    let store = self::store(tmp.path());
    let spec = store.spec_path(&ClaimUid::new(UUID).unwrap());
    fs::create_dir(&spec).unwrap();
    let err = store.remove_claim(UUID).unwrap_err();
    assert!(
        matches!(&err, StoreError::Io { path, .. } if path == &spec),
        "{err:?}"
    );
    assert!(spec.is_dir(), "nothing was removed");
}

#[test]
fn read_claim_gives_back_the_edits_written_and_refuses_specs_it_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    let edits = [env(&["CLAIM_0=a"]), env(&["CLAIM_1=b", "X=1"])];
    store.write_claim(UUID, &edits).unwrap();
    assert_eq!(store.read_claim(UUID).unwrap(), edits);

    let missing = store.read_claim("nope").unwrap_err();
    assert!(
        matches!(
            &missing,
            StoreError::Io {
                op: "reading cdi spec",
                ..
            }
        ),
        "{missing}"
    );
    assert!(matches!(
        store.read_claim("../x").unwrap_err(),
        StoreError::Uid(_)
    ));

    let path = store.spec_path(&ClaimUid::new(UUID).unwrap());
    let refused = |contents: String| {
        fs::write(&path, contents).unwrap();
        match store.read_claim(UUID).unwrap_err() {
            e @ StoreError::Foreign { .. } => {
                let text = e.to_string();
                assert!(
                    text.starts_with(&format!(
                        "cdi spec {} of claim {UUID} is not one this store writes: ",
                        path.display()
                    )),
                    "{text}"
                );
                text
            }
            other => panic!("{other}"),
        }
    };
    let device = |name: &str| format!(r#"{{"name":"{name}","containerEdits":{{"env":["A=1"]}}}}"#);
    let spec = |kind: &str, devices: &[String], extra: &str| {
        format!(
            r#"{{"cdiVersion":"0.3.0","kind":"{kind}","devices":[{}]{extra}}}"#,
            devices.join(",")
        )
    };
    let ours = format!("{VENDOR}/device");
    assert!(refused("{ truncated".into()).contains("parsing a cdi spec as json: "));
    assert!(
        refused(spec(
            "other.io/device",
            &[device(&format!("claim-{UUID}-0"))],
            ""
        ))
        .ends_with(&format!(r#"its kind is "other.io/device", not "{ours}""#))
    );
    assert!(refused(spec(&ours, &[], "")).ends_with("it has no devices"));
    assert!(
        refused(spec(
            &ours,
            &[device(&format!("claim-{UUID}-0"))],
            r#","containerEdits":{"env":["B=2"]}"#
        ))
        .ends_with("it has spec-level container edits")
    );
    assert!(
        refused(spec(
            &ours,
            &[
                device(&format!("claim-{UUID}-0")),
                device(&format!("claim-{UUID}-2"))
            ],
            ""
        ))
        .ends_with(&format!(
            r#"devices[1] is named "claim-{UUID}-2", not "claim-{UUID}-1""#
        ))
    );
    // A spec it did write is read whatever its exact bytes.
    fs::write(
        &path,
        spec(&ours, &[device(&format!("claim-{UUID}-0"))], ""),
    )
    .unwrap();
    assert_eq!(store.read_claim(UUID).unwrap(), [env(&["A=1"])]);
}

#[test]
fn set_aside_renames_a_spec_out_of_every_scanner_and_keeps_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    s.write_claim(UUID, &[env(&["A=1"])]).unwrap();
    let path = s.spec_path(&ClaimUid::new(UUID).unwrap());
    fs::write(&path, b"{broken").unwrap();
    let aside = s.set_aside(UUID).unwrap().unwrap();
    assert_eq!(
        aside.file_name().unwrap().to_str().unwrap(),
        format!("{}.unreadable", path.file_name().unwrap().to_str().unwrap())
    );
    assert_eq!(fs::read(&aside).unwrap(), b"{broken");
    assert!(!path.exists());
    assert!(
        s.claims().unwrap().is_empty(),
        "no longer listed as a claim"
    );
    assert_eq!(s.set_aside(UUID).unwrap(), None, "nothing left to move");
    assert!(matches!(s.set_aside("../x"), Err(StoreError::Uid(_))));
}
