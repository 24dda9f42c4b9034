//! Table-driven placement scenarios on synthetic and XML topologies, each stating the cpusets.
//!
//! A scenario is a machine and a list of `(step, expected)` rows, run in order on one policy:
//!
//! - `alloc <id> <qos> cpu=<N|Nm> [mem=<MiB>] [ns=<namespace>] [pod=<uid>] [dev=<claim>:<i>]
//!   [env=<claim>] [<option>=<value>]` places a container (options are `resource-policy.resmgr.io`
//!   annotations scoped to it); expected `cpus=<set> mems=<set|->`, then ` | <id>=<cpus>` for
//!   every update of another container, by id, then ` ! <warning>` for each warning (what the
//!   policy did instead of refusing).
//! - `fail <same as alloc>`: expected is a fragment of the error.
//! - An expected value starting with `~` is a fragment of what the step prints.
//!
//! Machines run with `cpu-exclusivity: pods` (exclusive CPUs for Guaranteed containers) unless
//! they say otherwise.
//! - `release <id>`, `unclaim <uid>`: expected are the updates, `<id>=<cpus>` by id.
//! - `claim <uid> <device>:<cpus>... [pods=<uid>,...]`: expected are each result's CPUs, `;`
//!   separated, then the updates.
//! - `check <id>`: expected is its placement now, `cpus=<set> mems=<set|->`.

use std::{collections::BTreeMap, path::PathBuf};

use policy::{
    Claim, Container, ContainerUpdate, CpuSet, Pod, Policy, QosClass, Quantity, Resources,
    Topology, TopologyAware, TopologySource,
    model::AllocationResult,
    topology_aware::{ClaimCpus, Config, Exclusivity, ReservedCpus},
};

const DOMAIN: &str = "resource-policy.resmgr.io";

struct Machine {
    source: TopologySource,
    /// sysfs `online` and `isolated` contents, when the machine has offline or isolated CPUs.
    sysfs: Option<(&'static str, &'static str)>,
    reserved: ReservedCpus,
    exclusivity: Exclusivity,
}

fn synthetic(desc: &str, reserved: ReservedCpus) -> Machine {
    Machine {
        source: TopologySource::Synthetic(desc.into()),
        sysfs: None,
        reserved,
        exclusivity: Exclusivity::Pods,
    }
}

fn policy(machine: &Machine) -> TopologyAware {
    let dir = tempfile::tempdir().unwrap();
    let root = machine.sysfs.map(|(online, isolated)| {
        let cpu = dir.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), online).unwrap();
        std::fs::write(cpu.join("isolated"), isolated).unwrap();
        dir.path().to_owned()
    });
    let topo = Topology::load_with_sysfs(&machine.source, root.as_deref()).unwrap();
    let config = Config {
        reserved_cpus: machine.reserved.clone(),
        exclusivity: machine.exclusivity.clone(),
        ..Config::default()
    };
    TopologyAware::new(topo, config).unwrap()
}

fn set(s: &str) -> CpuSet {
    s.parse().unwrap()
}

fn container(words: &[&str]) -> Container {
    let (id, qos) = (words[0], words[1]);
    let qos = match qos {
        "guaranteed" => QosClass::Guaranteed,
        "burstable" => QosClass::Burstable,
        "besteffort" => QosClass::BestEffort,
        other => panic!("unknown qos {other}"),
    };
    let mut c = Container {
        id: id.into(),
        pod: Pod {
            uid: format!("pod-{id}"),
            namespace: "default".into(),
            name: format!("pod-{id}"),
            qos,
            annotations: BTreeMap::new(),
        },
        name: id.into(),
        resources: Resources::default(),
        annotations: BTreeMap::new(),
        cdi_devices: vec![],
        env: vec![],
        cpus: None,
        mems: None,
    };
    for word in &words[2..] {
        let (key, value) = word.split_once('=').unwrap();
        match key {
            "cpu" => {
                let q: Quantity = value.parse().unwrap();
                c.resources.cpu_request_milli = q.milli();
                if qos == QosClass::Guaranteed {
                    c.resources.cpu_limit_milli = Some(q.milli());
                }
            }
            "mem" => {
                let bytes = value.parse::<u64>().unwrap() << 20;
                c.resources.memory_request_bytes = bytes;
            }
            "ns" => c.pod.namespace = value.into(),
            "pod" => c.pod.uid = value.into(),
            "dev" => {
                let (uid, i) = value.split_once(':').unwrap();
                c.cdi_devices
                    .push(format!("topology-aware.resmgr.io/device=claim-{uid}-{i}"));
            }
            "env" => c.env.push(format!("DRA_CPUSET_{value}=whatever")),
            option => {
                c.annotations
                    .insert(format!("{option}.{DOMAIN}/container.{id}"), value.into());
            }
        }
    }
    c
}

fn updates(list: &[ContainerUpdate]) -> String {
    let mut ids: Vec<String> = list
        .iter()
        .map(|u| {
            let cpus = u.cpus.as_ref().map_or("-".into(), ToString::to_string);
            format!("{}={cpus}", u.container_id)
        })
        .collect();
    ids.sort();
    ids.join(" ")
}

fn with_updates(head: String, list: &[ContainerUpdate]) -> String {
    if list.is_empty() {
        head
    } else {
        format!("{head} | {}", updates(list))
    }
}

fn mems(m: Option<&CpuSet>) -> String {
    m.map_or("-".into(), ToString::to_string)
}

fn step(p: &mut TopologyAware, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words[0] {
        "alloc" => {
            let a = p
                .allocate(&container(&words[1..]))
                .unwrap_or_else(|e| panic!("{line}: {e}"));
            let head = format!(
                "cpus={} mems={}",
                a.adjustment.cpus.unwrap(),
                mems(a.adjustment.mems.as_ref())
            );
            let mut out = with_updates(head, &a.updates);
            for w in &a.warnings {
                out.push_str(" ! ");
                out.push_str(w);
            }
            out
        }
        "fail" => match p.allocate(&container(&words[1..])) {
            Ok(a) => format!("unexpected success: {a:?}"),
            Err(e) => e.to_string(),
        },
        "release" => updates(&p.release(words[1]).unwrap()),
        "unclaim" => updates(&p.release_claim(words[1]).unwrap()),
        "check" => {
            let pl = p.placement(words[1]).unwrap();
            format!("cpus={} mems={}", pl.cpus, mems(pl.mems.as_ref()))
        }
        "claim" => {
            let mut claim = Claim {
                uid: words[1].into(),
                namespace: "default".into(),
                name: format!("name-{}", words[1]),
                reserved_for: vec![],
                results: vec![],
                config: Vec::new(),
                pod_claim_name: None,
            };
            for w in &words[2..] {
                if let Some(pods) = w.strip_prefix("pods=") {
                    claim.reserved_for = pods.split(',').map(Into::into).collect();
                    continue;
                }
                let (device, n) = w.split_once(':').unwrap();
                claim.results.push(AllocationResult {
                    request: "cpus".into(),
                    pool: "node".into(),
                    device: device.into(),
                    share_id: None,
                    consumed_capacity: BTreeMap::from([("cpu".into(), n.parse().unwrap())]),
                });
            }
            match p.allocate_claim(&claim) {
                Ok(a) => {
                    let prefix = format!("DRA_CPUSET_{}=", claim.uid);
                    let cpus: Vec<String> = a
                        .edits
                        .iter()
                        .map(|e| {
                            e.env
                                .iter()
                                .find_map(|v| v.strip_prefix(&prefix))
                                .unwrap()
                                .to_owned()
                        })
                        .collect();
                    with_updates(cpus.join(";"), &a.updates)
                }
                Err(e) => e.to_string(),
            }
        }
        other => panic!("unknown step {other}"),
    }
}

fn run(machine: &Machine, rows: &[(&str, &str)]) {
    run_on(&mut policy(machine), rows);
}

fn run_on(p: &mut TopologyAware, rows: &[(&str, &str)]) {
    let mut failures = Vec::new();
    for (line, want) in rows {
        let got = step(p, line);
        let ok = if line.starts_with("fail") || want.starts_with('~') {
            got.contains(want.trim_start_matches('~'))
        } else {
            got == *want
        };
        if !ok {
            failures.push(format!("{line}\n   want: {want}\n    got: {got}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn one_socket_without_smt() {
    let machine = synthetic("pack:1 core:8 pu:1", ReservedCpus::Count(1));
    run(
        &machine,
        &[
            ("alloc g1 guaranteed cpu=2", "cpus=1-2 mems=0"),
            ("alloc b1 burstable cpu=500m", "cpus=3-7 mems=0"),
            ("alloc g2 guaranteed cpu=3", "cpus=3-5 mems=0 | b1=6-7"),
            // The last shared CPUs go to an exclusive grant, as the kubelet's static CPU
            // manager would give them: the shared containers run on the reserved CPUs.
            (
                "alloc g3 guaranteed cpu=2",
                "cpus=6-7 mems=0 | b1=0 ! container default/pod-g3/g3 took the last shared cpus of pool root: its shared containers (1) now run on the reserved cpus, as nothing else is shared (0)",
            ),
            // Exclusive CPUs that cannot be had: shared ones, with a warning, never a refusal.
            (
                "alloc g9 guaranteed cpu=1",
                "cpus=0 mems=0 ! needs 1 exclusive cpus; only 0 cpus are neither reserved nor held exclusively: runs on shared cpus instead ! no cpu is shared anywhere (claims and exclusive grants hold them all): runs on the reserved cpus 0 until some are shared again",
            ),
            ("release g9", ""),
            ("release g3", "b1=6-7"),
            ("alloc k1 besteffort ns=kube-system", "cpus=0 mems=0"),
            ("alloc f1 guaranteed cpu=1500m", "cpus=6-7 mems=0"),
            ("release g2", "b1=3-7 f1=3-7"),
            ("alloc g4 guaranteed cpu=1", "cpus=3 mems=0 | b1=4-7 f1=4-7"),
            (
                "alloc s1 guaranteed cpu=2 prefer-shared-cpus=true",
                "cpus=4-7 mems=0",
            ),
            ("release g1", "b1=1-2,4-7 f1=1-2,4-7 s1=1-2,4-7"),
            ("release g4", "b1=1-7 f1=1-7 s1=1-7"),
        ],
    );
}

#[test]
fn two_sockets_two_numa_nodes_eight_cores_two_threads() {
    let machine = synthetic("pack:2 numa:2 core:8 pu:2", ReservedCpus::Set(set("0-1")));
    run(
        &machine,
        &[
            // The tightest pool is a NUMA node; numa0 packs first (fewest free), whole cores.
            ("alloc g1 guaranteed cpu=4", "cpus=2-5 mems=0"),
            // A whole core, then one thread of an idle core.
            ("alloc g2 guaranteed cpu=3", "cpus=6-8 mems=0"),
            // One CPU: the free sibling of the core g2 split, not a fresh core.
            ("alloc g3 guaranteed cpu=1", "cpus=9 mems=0"),
            // Shared: the deepest pool with the most room.
            ("alloc b1 burstable cpu=2", "cpus=16-31 mems=1"),
            ("alloc g4 guaranteed cpu=8", "cpus=16-23 mems=1 | b1=24-31"),
            // Too big for a NUMA node: the tightest socket.
            ("alloc g5 guaranteed cpu=20", "cpus=32-51 mems=2-3"),
            ("release g4", "b1=16-31"),
            (
                "alloc k1 burstable cpu=100m ns=kube-system",
                "cpus=0-1 mems=0",
            ),
        ],
    );
}

#[test]
fn claims_on_a_partition_and_exclusive_cpus_from_the_rest() {
    // numa1 (16-31) and numa3 (48-63) are published for claims.
    let machine = Machine {
        exclusivity: Exclusivity::Partition(ClaimCpus::Set(set("16-31,48-63"))),
        ..synthetic("pack:2 numa:2 core:8 pu:2", ReservedCpus::Set(set("0-1")))
    };
    run(
        &machine,
        &[
            // Exclusive grants stay off the claimable CPUs: numa0 packs first.
            ("alloc g1 guaranteed cpu=4", "cpus=2-5 mems=0"),
            // Shared containers borrow the claimable CPUs while they are unclaimed.
            ("alloc b1 burstable cpu=2", "cpus=16-31 mems=1"),
            // Too big for numa0 and numa2 is all that is left of socket1 for exclusive grants.
            ("alloc g2 guaranteed cpu=16", "cpus=32-47 mems=2"),
            ("claim c1 numa3:2", "48-49"),
            // A claim takes back what it lent, whatever the shared containers need.
            ("claim c2 numa1:14", "16-29 | b1=30-31"),
            // Idempotent: same CPUs, no updates.
            ("claim c2 numa1:14", "16-29"),
            // The pool runs dry: its containers widen to what the socket still shares.
            ("claim c3 numa1:2", "30-31 | b1=6-15"),
            // More than the device has left: the scheduler never allocates it.
            (
                "claim c4 numa1:1",
                "claim default/name-c4 (c4) does not fit: result 0 (request cpus) consumed 1 cpus of device numa1, but only 0 of its 16 are free (16-31 held by claim default/name-c2 (c2), claim default/name-c3 (c3))",
            ),
            (
                "claim c5 numa0:1",
                "~device \"numa0\": it is not one this node publishes",
            ),
            ("unclaim c3", "b1=30-31"),
            ("unclaim c2", "b1=16-31"),
            ("unclaim c2", ""),
            // A container using claim c1 through its CDI device runs on the claim's CPUs.
            ("alloc x1 burstable cpu=1 dev=c1:0", "cpus=48-49 mems=3"),
            // The environment fallback needs the pod in the claim's reserved-for list.
            ("claim c6 numa3:2 pods=pod-x2", "50-51"),
            ("alloc x2 besteffort env=c6", "cpus=50-51 mems=3"),
            // Not reserved for x3's pod: an ordinary BestEffort container.
            ("alloc x3 besteffort env=c6", "~mems=3"),
        ],
    );
}

#[test]
fn eight_numa_nodes_thirty_two_cores_two_threads() {
    let machine = synthetic("pack:2 numa:4 core:32 pu:2", ReservedCpus::Count(2));
    run(
        &machine,
        &[
            // numa0 lost a core to the reserved CPUs: the first whole free node is numa1.
            ("alloc g1 guaranteed cpu=64", "cpus=64-127 mems=1"),
            // 1.5 GiB does not fit a 1 GiB node: memory widens to the closest node, CPUs stay.
            ("alloc g2 guaranteed cpu=6 mem=1536", "cpus=2-7 mems=0-1"),
            ("alloc b1 besteffort", "cpus=128-191 mems=2"),
            ("alloc b2 besteffort", "cpus=192-255 mems=3"),
            ("alloc b3 burstable cpu=62 mem=100", "cpus=256-319 mems=4"),
            // numa4's shared containers need 62 CPUs: a 4-CPU grant goes elsewhere.
            ("alloc g3 guaranteed cpu=4", "cpus=8-11 mems=0"),
            ("alloc g4 guaranteed cpu=64 mem=512", "cpus=320-383 mems=5"),
            ("alloc g5 guaranteed cpu=100", "cpus=384-483 mems=6-7"),
            // More memory than is free: the kubelet admitted it, so it runs unpinned.
            (
                "alloc g6 guaranteed cpu=1 mem=8192",
                "~cpus=256 mems=- | b3=257-319 ! needs 8192 MiB of memory, nodes 0-7 have 6044 MiB free;",
            ),
            ("release g6", "b3=256-319"),
            ("release g1", ""),
            ("check b1", "cpus=128-191 mems=2"),
        ],
    );
}

#[test]
fn offline_and_isolated_cpus() {
    let machine = Machine {
        source: TopologySource::Synthetic("pack:1 numa:2 core:4 pu:2".into()),
        sysfs: Some(("0-13\n", "6-7,12-13\n")),
        reserved: ReservedCpus::Count(1),
        exclusivity: Exclusivity::Pods,
    };
    run(
        &machine,
        &[
            // Offline 14-15, isolated 6-7 and 12-13, reserved 0: shared is 1-5,8-11.
            ("alloc b0 besteffort", "cpus=1-5 mems=0"),
            ("release b0", ""),
            (
                "alloc g1 guaranteed cpu=2 prefer-isolated-cpus=true",
                "cpus=12-13 mems=1",
            ),
            (
                "alloc g2 guaranteed cpu=2 prefer-isolated-cpus=true",
                "cpus=6-7 mems=0",
            ),
            // No isolated CPUs left: ordinary exclusive ones.
            (
                "alloc g3 guaranteed cpu=2 prefer-isolated-cpus=true",
                "cpus=8-9 mems=1",
            ),
            ("alloc g4 guaranteed cpu=4", "cpus=2-5 mems=0"),
            ("alloc b1 burstable cpu=100m", "cpus=10-11 mems=1"),
            // Neither NUMA node can spare two without starving b1 or leaving numa0 empty of
            // what b1 needs: the root gives one from each, splitting a core.
            ("alloc g5 guaranteed cpu=2", "cpus=1,10 mems=0-1 | b1=11"),
            // The last shared CPU goes to an exclusive grant: b1 runs on the reserved CPU.
            (
                "alloc g6 guaranteed cpu=1",
                "cpus=11 mems=1 | b1=0 ! container default/pod-g6/g6 took the last shared cpus of pool numa1: its shared containers (1) now run on the reserved cpus, as nothing else is shared (0)",
            ),
            ("release g6", "b1=11"),
            ("release g3", "b1=8-9,11"),
        ],
    );
}

#[test]
fn pools_carry_reserved_isolated_shared_and_exclusive_cpus() {
    let machine = Machine {
        source: TopologySource::Synthetic("pack:1 numa:2 core:4 pu:2".into()),
        sysfs: Some(("0-13\n", "6-7,12-13\n")),
        reserved: ReservedCpus::Count(1),
        exclusivity: Exclusivity::Pods,
    };
    let mut p = policy(&machine);
    run_on(
        &mut p,
        &[
            (
                "alloc g1 guaranteed cpu=2 prefer-isolated-cpus=true",
                "cpus=12-13 mems=1",
            ),
            ("alloc g2 guaranteed cpu=2", "cpus=8-9 mems=1"),
        ],
    );
    let names: Vec<&str> = p.pools().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["root", "numa0", "numa1"]);
    let split = |i| {
        let c = p.pool_cpus(i).unwrap();
        format!(
            "reserved {} isolated {} isolated-granted {} shared {} exclusive {}",
            c.reserved, c.isolated, c.isolated_granted, c.shared, c.exclusive
        )
    };
    assert_eq!(
        split(0),
        "reserved 0 isolated 6-7 isolated-granted 12-13 shared 1-5,10-11 exclusive 8-9"
    );
    assert_eq!(
        split(2),
        "reserved  isolated  isolated-granted 12-13 shared 10-11 exclusive 8-9"
    );
}

#[test]
fn memory_only_nodes_are_used_when_asked_for() {
    let machine = synthetic(
        "pack:2 [numa(memory=4GiB)] [numa(memory=1GiB)] core:2 pu:2",
        ReservedCpus::Count(1),
    );
    run(
        &machine,
        &[
            (
                "alloc g1 guaranteed cpu=2 mem=512 memory-type=hbm",
                "cpus=2-3 mems=1",
            ),
            // socket0's HBM has 512 MiB left: the other socket's.
            (
                "alloc g2 guaranteed cpu=1 mem=768 memory-type=hbm",
                "cpus=4 mems=3",
            ),
            (
                "alloc g3 guaranteed cpu=1 mem=2048 memory-type=dram,hbm",
                "cpus=1 mems=0-1",
            ),
            // DRAM only by default, never the HBM nodes.
            ("alloc b1 besteffort", "cpus=5-7 mems=2"),
            // 6 GiB: socket1's 4 GiB widened to socket0's DRAM node (2 GiB left there).
            (
                "alloc g4 guaranteed cpu=1 mem=6144",
                "cpus=5 mems=0,2 | b1=6-7",
            ),
            (
                "alloc g5 guaranteed cpu=1 mem=4096",
                "~cpus=6 mems=- | b1=7 ! needs 4096 MiB of memory, nodes 0,2 have 0 MiB free;",
            ),
            ("release g5", "b1=6-7"),
            ("alloc u1 besteffort pin-memory=false", "cpus=6-7 mems=-"),
        ],
    );
}

#[test]
fn xml_machine_with_firmware_distances_and_a_cxl_node() {
    let machine = Machine {
        source: TopologySource::Xml(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/four-sockets-slit.xml"),
        ),
        sysfs: None,
        reserved: ReservedCpus::Set(CpuSet::new()),
        exclusivity: Exclusivity::Pods,
    };
    run(
        &machine,
        &[
            // 3 GiB from socket0's 2 GiB node: the SLIT makes node 2 (15) closer than node 1 (30).
            ("alloc g1 guaranteed cpu=2 mem=3072", "cpus=0-1 mems=0,2"),
            // CXL memory hangs off socket 1 and is used only when asked for.
            (
                "alloc g2 guaranteed cpu=2 mem=4096 memory-type=cxl",
                "cpus=4-5 mems=4",
            ),
            // socket0's DRAM is full and it has no CXL memory: socket1, whose CXL node has room.
            (
                "alloc g3 guaranteed cpu=2 mem=1024 memory-type=dram,cxl",
                "cpus=6-7 mems=1,4",
            ),
            ("alloc b1 besteffort", "cpus=8-11 mems=2"),
        ],
    );
}

#[test]
fn devices_are_one_per_numa_node_with_consumable_cpu_capacity() {
    let machine = Machine {
        exclusivity: Exclusivity::Claims,
        ..synthetic("pack:2 numa:2 core:8 pu:2", ReservedCpus::Set(set("0-1")))
    };
    let p = policy(&machine);
    let devices = p.devices().unwrap();
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["numa0", "numa1", "numa2", "numa3"]);
    let d = &devices[0];
    assert!(d.allow_multiple_allocations);
    let cpu = &d.capacities["cpu"];
    assert_eq!(
        cpu.value,
        Quantity::from_units(14),
        "two reserved cpus are not claimable"
    );
    let rp = cpu.request_policy.as_ref().unwrap();
    assert_eq!(rp.default, Some(Quantity::from_units(1)));
    assert_eq!(
        rp.valid,
        policy::ValidValues::Range {
            min: Quantity::from_units(1),
            max: Some(Quantity::from_units(14)),
            step: Some(Quantity::from_units(1)),
        }
    );
    use policy::AttributeValue::{Bool, Int};
    assert_eq!(d.attributes["resource.kubernetes.io/numaNode"], Int(0));
    assert_eq!(devices[3].attributes["socket"], Int(1));
    assert_eq!(d.attributes["smt"], Bool(true));
    assert_eq!(
        d.attributes["wholeCores"],
        Bool(false),
        "single threads of cores"
    );
    // With exclusive CPUs for pods, nothing is published.
    assert_eq!(
        policy(&synthetic(
            "pack:2 numa:2 core:8 pu:2",
            ReservedCpus::Set(set("0-1"))
        ))
        .devices()
        .unwrap(),
        []
    );
}
