// Package scale measures what resmgr's device models cost a cluster: the real kube-apiserver and
// kube-scheduler (tests/controlplane/build), N Ready Node objects, each with the ResourceSlices
// `resmgr slices` prints for a two-socket server (4 NUMA nodes, 128 threads, 2 reserved), then
// M pods, each with its own ResourceClaim, created as fast as the API server takes them.
//
// Per device model it reports pods scheduled per second in the steady state (between the 10th and
// the 90th percentile of bind times), the p50 and p99 of creation-to-bound latency, the
// scheduler's CPU seconds and peak resident memory, the API server's resident memory, and the
// slices' count and bytes as the API server stores them. Every (nodes, model) phase runs on a
// control plane of its own, so no phase inherits another's objects or caches, and the models
// alternate within a round, so the machine's load falls on each alike.
//
// It is BenchmarkScale, run by `cargo xtask bench --scale` (not by `cargo xtask test`), which
// builds the binaries and sets the environment variables read in scale_test.go; each phase
// prints one `scale: {json}` line for it.
package scale
