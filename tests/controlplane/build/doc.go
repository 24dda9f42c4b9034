// Package build pins the Kubernetes control plane that the e2e scenarios in tests/controlplane
// run against, and builds it from the Go module proxy: `cargo xtask e2e --stage controlplane`
// and `--stage cluster` (and `cargo xtask test`) run
//
//	go build -trimpath -o DIR k8s.io/kubernetes/cmd/kube-apiserver \
//	    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
//	    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl ./cmd/etcd
//
// here, with version linker flags, and cache the binaries by a hash of this directory.
//
// `go install k8s.io/kubernetes/cmd/...@version` is refused because k8s.io/kubernetes replaces
// its staging modules (k8s.io/api, k8s.io/client-go, ...) with local paths; this module
// requires k8s.io/kubernetes and replaces each staging module with its published v0.X.Y
// instead. The `tool` directives in go.mod keep the commands' dependencies in go.sum. etcd is
// built from the etcd server module the same graph already pins (cmd/etcd), so the control
// plane needs no system package and runs a version kube-apiserver supports.
//
// Nothing else belongs here: any other dependency would change the versions kube-apiserver is
// built with. To move to another Kubernetes release, change the k8s.io/kubernetes version and
// every replace to the matching v0.X.Y, then run `go mod tidy`.
package build
