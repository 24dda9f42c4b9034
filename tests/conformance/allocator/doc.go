// Package allocator checks resmgr's model of the scheduler (the Rust policy::scheduler) against
// kube-scheduler's own allocator, k8s.io/dynamic-resource-allocation/structured, at the version
// the control-plane tests run.
//
// Both read the same test vectors, crates/policy/tests/fixtures/scheduler-vectors.json: the
// devices the agent publishes, the claims already allocated from them, a claim to allocate,
// whether DRAConsumableCapacity is on, and the expected results. The Rust test checks the model
// gives them; this test checks the real allocator gives them. It also runs the claim and
// DeviceClass of examples/kubernetes/claim-cpus-memory-individual.yaml, with the chart's
// DeviceClass, through the real allocator and its CEL. It is a module of its own so that
// the Kubernetes libraries stay out of the protocol tests' module.
package allocator
