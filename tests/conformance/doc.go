// Package conformance runs resmgr's Rust code against the upstream reference implementations of
// the protocols it speaks: containerd's NRI runtime side (github.com/containerd/nri/pkg/adaptation),
// the kubelet's generated DRA and plugin-registration gRPC clients (k8s.io/kubelet), and the CDI
// cache that containerd and CRI-O use to resolve devices (tags.cncf.io/container-device-interface).
//
// Each protocol has a package of its own: nri, kubelet and cdi. The Rust binaries they drive are
// found through RESMGR_BIN_DIR, which `cargo xtask test` sets after building them; run alone,
// `go test ./...` builds them with cargo first (see internal/rustbin).
//
// Nothing of the product is written in Go: this module is tests only.
package conformance
