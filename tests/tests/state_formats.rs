//! Every state format this project has written is read by the current build, whole; and what
//! the current build writes, every older build reads whole or refuses.
//!
//! `tests/fixtures/state/<nn>-<name>/state.json` is a state file of each format, written by
//! the build its README names (`resmgr simulate` on the `scenario.yaml` beside it). Each is
//! loaded the way the agent loads it at start-up, through [`StateFile::load`] and the real
//! topology-aware policy's `restore`, on the machine and settings it was written on, and what
//! it holds is checked: the claims, their devices, CPUs, memory nodes, memory and hugepages,
//! and that the policy's claims and the claim records come back unchanged (nothing read in
//! part). A format change without a migration fails here; a new fixture fails here until it is
//! listed in [`FIXTURES`].
//!
//! The older builds cannot run here, so what they do with a state is modelled from their serde
//! types and checks ([`READERS`], one per format; the fixtures' README records the same
//! outcomes from the real old binaries): the state file refused fields it did not know from the
//! first format on, the policy's snapshot before version 2 did not, but every build refused a
//! snapshot version other than its own. The model must say of every state the current build
//! writes that each older build reads it whole or refuses it, never that it drops a field.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use policy::{
    Policy, Topology, TopologySource,
    topology_aware::{
        Config, DeviceMode, DeviceModel, MemoryConfig, NodeReservation, ReservedCpus, TopologyAware,
    },
};
use resmgr::state::{STATE_VERSION, State, StateFile};
use serde_json::Value;

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/state")
}

/// One fixture: where it was written and what it holds.
struct Fixture {
    dir: &'static str,
    /// The machine it was written on (its scenario's `topology`).
    topology: &'static str,
    /// The policy's settings (its scenario's header).
    config: fn() -> Config,
    /// Hugepages each node keeps, which a synthetic topology cannot say: (node, page size,
    /// pages), as its scenario's `hugepages`.
    hugepages: &'static [(u32, u64, u64)],
    /// The snapshot version in the file, and the one the current build writes for it.
    versions: (u64, u64),
    claims: &'static [Want],
    /// Bytes of memory claims hold of each node's account, and hugepages (node, size, bytes).
    memory_claimed: &'static [(u32, u64)],
    hugepages_claimed: &'static [(u32, u64, u64)],
}

/// One claim a fixture holds.
struct Want {
    /// The simulator's claim UID, by its counter.
    uid: u64,
    /// `namespace/name`: `/` for a claim taken back from its spec.
    name: &'static str,
    devices: &'static [&'static str],
    cpus: &'static str,
    /// The memory nodes it grants: none when its memory is not pinned.
    mems: &'static str,
    memory: u64,
    hugepages: &'static [(u64, u64)],
    adopted: bool,
    /// How many of its devices carry the share ID the kubelet passed (devices allocated in
    /// shares; a claim taken back from its spec does not know them).
    shares: usize,
}

fn sim_uid(n: u64) -> String {
    format!("0000c1a1-0000-4000-8000-{n:012x}")
}

/// `topology`, `reserved-cpus: "0-1"`: the settings of every fixture's scenario but these.
fn cpus_only() -> Config {
    Config {
        reserved_cpus: ReservedCpus::Set("0-1".parse().unwrap()),
        ..Config::default()
    }
}

/// `reserved-memory: "0:memory=2Gi"`.
fn reserved_memory() -> BTreeMap<u32, NodeReservation> {
    BTreeMap::from([(
        0,
        NodeReservation {
            memory: 2 * GI,
            hugepages: BTreeMap::new(),
        },
    )])
}

/// 04 and 06: `claim-memory: 75%`, `claim-hugepages: true`.
fn memory_and_hugepages() -> Config {
    Config {
        memory: MemoryConfig {
            reserved: reserved_memory(),
            claim_percent: 75,
            claim_hugepages: true,
        },
        ..cpus_only()
    }
}

/// 05: `device-mode: individual`, `claim-memory: 50%`.
fn individual_with_memory() -> Config {
    Config {
        devices: DeviceModel {
            mode: DeviceMode::Individual,
            ..DeviceModel::default()
        },
        memory: MemoryConfig {
            reserved: reserved_memory(),
            claim_percent: 50,
            claim_hugepages: false,
        },
        ..cpus_only()
    }
}

const TWO_NUMA: &str = "pack:1 numa:2(memory=32GiB) core:4 pu:2";
const HUGEPAGES: &[(u32, u64, u64)] = &[(0, 2 * MI, 512), (1, 2 * MI, 512), (1, GI, 4)];

/// Claims of 04 and 06: memory and hugepages, one unpinned, one of CPUs alone.
const MEMORY_CLAIMS: &[Want] = &[
    Want {
        uid: 2,
        name: "default/db",
        devices: &["numa1"],
        cpus: "8-11",
        mems: "1",
        memory: 16 * GI,
        hugepages: &[(GI, 2 * GI)],
        adopted: false,
        shares: 1,
    },
    Want {
        uid: 5,
        name: "default/cache",
        devices: &["numa0"],
        cpus: "2-3",
        mems: "",
        memory: 4 * GI,
        hugepages: &[(2 * MI, 64 * MI)],
        adopted: false,
        shares: 1,
    },
    Want {
        uid: 8,
        name: "default/proxy",
        devices: &["numa0"],
        cpus: "4",
        mems: "0",
        memory: 0,
        hugepages: &[],
        adopted: false,
        shares: 1,
    },
];

const FIXTURES: &[Fixture] = &[
    Fixture {
        dir: "01-cpus",
        topology: TWO_NUMA,
        config: cpus_only,
        hugepages: &[],
        versions: (1, 1),
        claims: &[
            Want {
                uid: 4,
                name: "shop/cache-cpus",
                devices: &["numa0"],
                cpus: "2-3",
                mems: "0",
                memory: 0,
                hugepages: &[],
                adopted: false,
                shares: 1,
            },
            Want {
                uid: 7,
                name: "shop/search-cpus",
                devices: &["numa1", "numa1"],
                cpus: "8-11",
                mems: "1",
                memory: 0,
                hugepages: &[],
                adopted: false,
                shares: 2,
            },
        ],
        memory_claimed: &[],
        hugepages_claimed: &[],
    },
    Fixture {
        dir: "02-memory-pinning",
        topology: TWO_NUMA,
        config: cpus_only,
        hugepages: &[],
        versions: (1, 2),
        claims: &[
            Want {
                uid: 2,
                name: "shop/cache-cpus",
                devices: &["numa0"],
                cpus: "2-3",
                mems: "0",
                memory: 0,
                hugepages: &[],
                adopted: false,
                shares: 1,
            },
            Want {
                uid: 5,
                name: "jobs/batch-cpus",
                devices: &["numa1"],
                cpus: "8-10",
                mems: "",
                memory: 0,
                hugepages: &[],
                adopted: false,
                shares: 1,
            },
        ],
        memory_claimed: &[],
        hugepages_claimed: &[],
    },
    Fixture {
        dir: "03-adopted",
        topology: TWO_NUMA,
        config: cpus_only,
        hugepages: &[],
        versions: (1, 2),
        claims: &[
            Want {
                uid: 2,
                name: "/",
                devices: &["numa1", "numa1"],
                cpus: "8-10",
                mems: "1",
                memory: 0,
                hugepages: &[],
                adopted: true,
                shares: 0,
            },
            Want {
                uid: 3,
                name: "jobs/batch-cpus",
                devices: &["numa0"],
                cpus: "2-3",
                mems: "",
                memory: 0,
                hugepages: &[],
                adopted: false,
                shares: 1,
            },
        ],
        memory_claimed: &[],
        hugepages_claimed: &[],
    },
    Fixture {
        dir: "04-memory-hugepages",
        topology: TWO_NUMA,
        config: memory_and_hugepages,
        hugepages: HUGEPAGES,
        versions: (1, 2),
        claims: MEMORY_CLAIMS,
        memory_claimed: &[(0, 4 * GI), (1, 16 * GI)],
        hugepages_claimed: &[(0, 2 * MI, 64 * MI), (1, GI, 2 * GI)],
    },
    Fixture {
        dir: "05-memory-devices-and-kinds",
        topology: "pack:2 [numa(memory=32GiB)] [numa(memory=4GiB)] core:4 pu:2",
        config: individual_with_memory,
        hugepages: &[],
        versions: (1, 2),
        claims: &[
            Want {
                uid: 2,
                name: "default/db",
                devices: &["memory0", "cpu2", "cpu3"],
                cpus: "2-3",
                mems: "0",
                memory: 12 * GI,
                hugepages: &[],
                adopted: false,
                shares: 1,
            },
            Want {
                uid: 5,
                name: "default/fast-cpus",
                devices: &["cpu4"],
                cpus: "4",
                mems: "0-1",
                memory: 0,
                hugepages: &[],
                adopted: false,
                shares: 1,
            },
        ],
        memory_claimed: &[(0, 12 * GI)],
        hugepages_claimed: &[],
    },
    Fixture {
        dir: "06-snapshot-v2",
        topology: TWO_NUMA,
        config: memory_and_hugepages,
        hugepages: HUGEPAGES,
        versions: (2, 2),
        claims: MEMORY_CLAIMS,
        memory_claimed: &[(0, 4 * GI), (1, 16 * GI)],
        hugepages_claimed: &[(0, 2 * MI, 64 * MI), (1, GI, 2 * GI)],
    },
];

fn policy_for(fixture: &Fixture) -> TopologyAware {
    let mut topology = Topology::load(&TopologySource::Synthetic(fixture.topology.into())).unwrap();
    for &(node, size, pages) in fixture.hugepages {
        let numa = topology
            .numa_nodes
            .iter_mut()
            .find(|n| n.id == node)
            .unwrap();
        numa.hugepages.insert(size, pages);
    }
    TopologyAware::new(topology, (fixture.config)()).unwrap()
}

fn raw(dir: &Path) -> Value {
    serde_json::from_slice(&fs::read(dir.join("state.json")).unwrap()).unwrap()
}

/// The fixtures on disk, by directory name.
fn on_disk() -> BTreeSet<String> {
    fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .collect()
}

#[test]
fn every_fixture_on_disk_is_checked_and_every_checked_one_is_on_disk() {
    let listed: BTreeSet<String> = FIXTURES.iter().map(|f| f.dir.to_owned()).collect();
    let found = on_disk();
    assert!(
        !found.is_empty(),
        "no fixture in {}",
        fixtures_dir().display()
    );
    assert_eq!(
        found,
        listed,
        "the fixtures in {} and those this test checks differ",
        fixtures_dir().display()
    );
    for dir in &found {
        for file in ["state.json", "scenario.yaml"] {
            assert!(
                fixtures_dir().join(dir).join(file).is_file(),
                "{dir} has no {file}"
            );
        }
    }
}

#[test]
fn the_current_build_reads_every_format_whole() {
    for fixture in FIXTURES {
        let at = fixture.dir;
        let dir = fixtures_dir().join(at);
        let mut policy = policy_for(fixture);
        // The agent's start-up path: the state file, then the policy's snapshot.
        let state = StateFile::new(&dir)
            .load(policy.name())
            .unwrap_or_else(|e| panic!("{at}: {e}"))
            .unwrap_or_else(|| panic!("{at}: no state"));
        assert_eq!(state.version, STATE_VERSION, "{at}");
        policy
            .restore(&state.policy_state)
            .unwrap_or_else(|e| panic!("{at}: {e}"));

        let raw = raw(&dir);
        assert_eq!(raw["policy_state"]["version"], fixture.versions.0, "{at}");
        // Nothing was read in part: the claim records and the policy's claims come back as
        // they were written, under the version the current build writes for them.
        assert_eq!(serde_json::to_value(&state).unwrap(), raw, "{at}");
        let mut written = raw["policy_state"].clone();
        written["version"] = fixture.versions.1.into();
        assert_eq!(policy.snapshot(), written, "{at}");

        let inventory = policy.inventory();
        let uids: Vec<String> = fixture.claims.iter().map(|w| sim_uid(w.uid)).collect();
        assert_eq!(policy.claims(), uids, "{at}");
        assert_eq!(
            state.claims.keys().cloned().collect::<Vec<_>>(),
            uids,
            "{at}"
        );
        for want in fixture.claims {
            let uid = sim_uid(want.uid);
            let at = format!("{at}: claim {}", want.name);
            let held = inventory.claims.iter().find(|c| c.uid == uid).unwrap();
            assert_eq!(
                format!("{}/{}", held.namespace, held.name),
                want.name,
                "{at}"
            );
            assert_eq!(held.devices, want.devices, "{at}");
            assert_eq!(held.cpus.to_string(), want.cpus, "{at}");
            assert_eq!(policy.claim_cpus(&uid).unwrap().to_string(), want.cpus);
            assert_eq!(held.mems.to_string(), want.mems, "{at}");
            assert_eq!(held.memory, want.memory, "{at}");
            assert_eq!(
                held.hugepages,
                want.hugepages.iter().copied().collect::<BTreeMap<_, _>>(),
                "{at}"
            );
            let record = &state.claims[&uid];
            assert_eq!(record.adopted, want.adopted, "{at}");
            assert_eq!(record.devices.len(), want.devices.len(), "{at}");
            for (i, device) in record.devices.iter().enumerate() {
                assert_eq!(
                    device.cdi_device_id,
                    format!("topology-aware.resmgr.io/device=claim-{uid}-{i}"),
                    "{at}"
                );
            }
            let shares = record.devices.iter().filter(|d| d.share_id.is_some());
            assert_eq!(shares.count(), want.shares, "{at}");
        }
        // What claims hold is charged to each node's account again, so the devices do not
        // promise it twice.
        let nodes: Vec<u32> = policy.topology().numa_nodes.iter().map(|n| n.id).collect();
        for node in nodes {
            let want = fixture
                .memory_claimed
                .iter()
                .find(|(n, _)| *n == node)
                .map_or(0, |(_, b)| *b);
            assert_eq!(policy.memory_claimed(node), want, "{at}: node {node}");
        }
        for &(node, size, bytes) in fixture.hugepages_claimed {
            assert_eq!(
                policy.hugepages_claimed(node, size),
                bytes,
                "{at}: node {node} hugepages {size}"
            );
        }
        assert!(
            inventory.claims.iter().all(|c| !c.cpus.is_empty()),
            "{at}: {inventory:?}"
        );
    }
}

// === older readers ===

/// What a build of one format knows: the fields of each record (the state file's refused
/// unknown fields from the first format on, the snapshot's not before version 2) and the
/// snapshot versions it reads.
struct Reader {
    /// The commit that introduced the format, and its first day.
    since: &'static str,
    record_fields: &'static [&'static str],
    claim_fields: &'static [&'static str],
    result_fields: &'static [&'static str],
    snapshot_versions: &'static [u64],
    /// Whether its snapshot refuses unknown fields.
    strict_snapshot: bool,
    /// Whether its restore refuses a result on a device other than a grouped `numa<N>`
    /// ("device memory0 is not published on this machine"), as builds did before 28c80fa.
    numa_devices_only: bool,
}

const RECORD_V1: &[&str] = &["namespace", "name", "devices"];
const RECORD_ADOPTED: &[&str] = &["namespace", "name", "devices", "adopted"];
const CLAIM_V1: &[&str] = &["uid", "namespace", "name", "reserved_for", "results"];
const CLAIM_ADOPTED: &[&str] = &[
    "uid",
    "namespace",
    "name",
    "reserved_for",
    "results",
    "adopted",
];
const RESULT_V1: &[&str] = &["request", "device", "cpus", "mems"];
const RESULT_PINNING: &[&str] = &["request", "device", "cpus", "mems", "memory_pinning"];
const RESULT_MEMORY: &[&str] = &[
    "request",
    "device",
    "cpus",
    "mems",
    "memory_pinning",
    "memory_node",
    "memory",
    "hugepages",
];

/// One reader per format, as the commit that introduced the format read, oldest first; the
/// last is the current build.
const READERS: &[Reader] = &[
    Reader {
        since: "755633b",
        record_fields: RECORD_V1,
        claim_fields: CLAIM_V1,
        result_fields: RESULT_V1,
        snapshot_versions: &[1],
        strict_snapshot: false,
        numa_devices_only: true,
    },
    Reader {
        since: "dd2cc73",
        record_fields: RECORD_V1,
        claim_fields: CLAIM_V1,
        result_fields: RESULT_PINNING,
        snapshot_versions: &[1],
        strict_snapshot: false,
        numa_devices_only: true,
    },
    Reader {
        since: "6c8db4b",
        record_fields: RECORD_ADOPTED,
        claim_fields: CLAIM_ADOPTED,
        result_fields: RESULT_PINNING,
        snapshot_versions: &[1],
        strict_snapshot: false,
        numa_devices_only: false,
    },
    Reader {
        since: "5696b47",
        record_fields: RECORD_ADOPTED,
        claim_fields: CLAIM_ADOPTED,
        result_fields: RESULT_MEMORY,
        snapshot_versions: &[1],
        strict_snapshot: false,
        numa_devices_only: false,
    },
    Reader {
        since: "current",
        record_fields: RECORD_ADOPTED,
        claim_fields: CLAIM_ADOPTED,
        result_fields: RESULT_MEMORY,
        snapshot_versions: &[1, 2],
        strict_snapshot: true,
        numa_devices_only: false,
    },
];

/// What a reader does with a state.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Reads every field.
    Whole,
    /// Refuses it, saying this.
    Refused(String),
    /// Reads it without a word, dropping these fields.
    Drops(BTreeSet<String>),
}

fn unknown(value: &Value, known: &[&str]) -> BTreeSet<String> {
    value
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect()
}

impl Reader {
    fn read(&self, state: &Value) -> Outcome {
        // StateFile::load: the version, then every record, refusing unknown fields.
        if state["version"] != 1 {
            return Outcome::Refused(format!("has format version {}", state["version"]));
        }
        for record in state["claims"].as_object().unwrap().values() {
            if let Some(field) = unknown(record, self.record_fields).pop_first() {
                return Outcome::Refused(format!("is corrupt: unknown field `{field}`"));
            }
        }
        // The policy's restore: its snapshot version, then its claims.
        let snapshot = &state["policy_state"];
        let version = snapshot["version"].as_u64().unwrap();
        if !self.snapshot_versions.contains(&version) {
            return Outcome::Refused(format!("snapshot version {version} is not 1"));
        }
        let claims = snapshot["claims"].as_array().unwrap();
        let results = claims.iter().flat_map(|c| c["results"].as_array().unwrap());
        for result in results {
            let device = result["device"].as_str().unwrap();
            let numa = device
                .strip_prefix("numa")
                .is_some_and(|n| n.parse::<u32>().is_ok());
            if self.numa_devices_only && !numa {
                return Outcome::Refused(format!(
                    "device {device} is not published on this machine"
                ));
            }
        }
        let mut dropped = BTreeSet::new();
        for claim in claims {
            dropped.extend(unknown(claim, self.claim_fields));
            for result in claim["results"].as_array().unwrap() {
                dropped.extend(unknown(result, self.result_fields));
            }
        }
        match dropped.pop_first() {
            None => Outcome::Whole,
            Some(field) if self.strict_snapshot => {
                Outcome::Refused(format!("unknown field `{field}`"))
            }
            Some(field) => {
                dropped.insert(field);
                Outcome::Drops(dropped)
            }
        }
    }
}

fn drops(fields: &[&str]) -> Outcome {
    Outcome::Drops(fields.iter().map(|f| (*f).to_owned()).collect())
}

fn refused(why: &str) -> Outcome {
    Outcome::Refused(why.to_owned())
}

/// The model's verdicts on the fixtures as they were written, which the real old binaries gave
/// too (tests/fixtures/state/README.md): this is why version 2 exists.
#[test]
fn older_builds_read_older_formats_whole_and_dropped_newer_fields_before_version_2() {
    let whole = || Outcome::Whole;
    // (fixture, outcome by reader, oldest first)
    let table: Vec<(&str, [Outcome; 5])> = vec![
        ("01-cpus", [whole(), whole(), whole(), whole(), whole()]),
        (
            "02-memory-pinning",
            [
                drops(&["memory_pinning"]),
                whole(),
                whole(),
                whole(),
                whole(),
            ],
        ),
        (
            "03-adopted",
            [
                refused("is corrupt: unknown field `adopted`"),
                refused("is corrupt: unknown field `adopted`"),
                whole(),
                whole(),
                whole(),
            ],
        ),
        (
            "04-memory-hugepages",
            [
                drops(&["hugepages", "memory", "memory_node", "memory_pinning"]),
                drops(&["hugepages", "memory", "memory_node"]),
                drops(&["hugepages", "memory", "memory_node"]),
                whole(),
                whole(),
            ],
        ),
        (
            "05-memory-devices-and-kinds",
            [
                refused("device memory0 is not published on this machine"),
                refused("device memory0 is not published on this machine"),
                drops(&["memory", "memory_node"]),
                whole(),
                whole(),
            ],
        ),
        (
            "06-snapshot-v2",
            [
                refused("snapshot version 2 is not 1"),
                refused("snapshot version 2 is not 1"),
                refused("snapshot version 2 is not 1"),
                refused("snapshot version 2 is not 1"),
                whole(),
            ],
        ),
    ];
    assert_eq!(
        table.iter().map(|(d, _)| *d).collect::<BTreeSet<_>>(),
        on_disk().iter().map(String::as_str).collect(),
        "every fixture has its row"
    );
    for (dir, outcomes) in table {
        let state = raw(&fixtures_dir().join(dir));
        for (reader, want) in READERS.iter().zip(outcomes) {
            assert_eq!(reader.read(&state), want, "{dir} read by {}", reader.since);
        }
    }
}

/// What the current build writes, for every fixture it restores: each older build reads it
/// whole or refuses it, and never drops a field without a word.
#[test]
fn every_older_build_reads_what_the_current_build_writes_whole_or_refuses_it() {
    for fixture in FIXTURES {
        let dir = fixtures_dir().join(fixture.dir);
        let mut policy = policy_for(fixture);
        let state = StateFile::new(&dir).load(policy.name()).unwrap().unwrap();
        policy.restore(&state.policy_state).unwrap();
        // What the agent saves after the start-up: the records, and the policy's snapshot now.
        let now = serde_json::to_value(State {
            policy_state: policy.snapshot(),
            ..state
        })
        .unwrap();
        let mut verdicts = Vec::new();
        for reader in READERS {
            let outcome = reader.read(&now);
            assert!(
                !matches!(outcome, Outcome::Drops(_)),
                "{}: a build of {} would read what the current build writes in part: {outcome:?}",
                fixture.dir,
                reader.since
            );
            verdicts.push(outcome == Outcome::Whole);
        }
        // The current build reads it, and a state any older build reads whole, they all do.
        assert_eq!(verdicts.last(), Some(&true), "{}", fixture.dir);
        if fixture.versions.1 == 1 {
            assert!(verdicts.iter().all(|w| *w), "{}", fixture.dir);
        }
    }
}

/// The model's current reader is the build's own: what the model refuses, `restore` refuses,
/// naming the same field.
#[test]
fn the_current_build_refuses_a_field_it_does_not_know_as_the_model_says() {
    let fixture = &FIXTURES[0];
    let mut state = raw(&fixtures_dir().join(fixture.dir));
    state["policy_state"]["claims"][0]["results"][0]["memory_tier"] = "hbm".into();
    let current = READERS.last().unwrap();
    assert_eq!(current.read(&state), refused("unknown field `memory_tier`"));
    let err = policy_for(fixture)
        .restore(&state["policy_state"])
        .unwrap_err();
    let err = stdx::errors::chain(&err);
    assert!(
        err.contains("claims[0].results[0].memory_tier")
            && err.contains("unknown field `memory_tier`"),
        "{err}"
    );
}
