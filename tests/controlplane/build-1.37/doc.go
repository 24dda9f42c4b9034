// Package build pins the second Kubernetes release the e2e's control plane and cluster stages
// run against, 1.37, as ../build pins the primary one (1.36): the same commands, built the same
// way by xtask (xtask/src/build/kubernetes.rs, which finds every build-<minor> module next to
// ../build), at k8s.io/kubernetes v1.37.2 with every staging module replaced by its published
// v0.37.2, and etcd's server at the version that release pins (v3.7.0). See ../build/doc.go
// for why the module exists and holds nothing else.
//
// Kubernetes 1.37.2 still builds with Go 1.26, so go.mod names no toolchain. A release that
// needs a newer Go says so in a `toolchain` line, which xtask passes to the go command as
// GOTOOLCHAIN (machines here run with GOTOOLCHAIN=local, which ignores the line).
package build
