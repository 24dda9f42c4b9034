// Package deploy checks resmgr's deployment objects against the upstream implementations that
// consume them:
//
//   - the chart renderer `cargo xtask` runs (tools/helm-chart/go, Helm's own engine, imported here)
//     renders the chart in deploy/helm/resmgr for the values the tests choose;
//   - kubeconform validates every object (chart output, plain manifests, examples) against JSON
//     schemas made from the Kubernetes 1.34 OpenAPI document (api/openapi-spec/swagger.json of the
//     k8s.io/kubernetes module, fetched through the Go module proxy, so nothing is downloaded from
//     anywhere else and the check runs where only the proxy is reachable);
//   - the API server's CEL environment (k8s.io/apiserver/pkg/cel/environment, at compatibility
//     version 1.34) compiles and evaluates the ValidatingAdmissionPolicy's expressions on requests
//     from the agent's node (allowed) and about other nodes (denied);
//   - `cargo xtask release` writes a chart package that Helm's loader reads and renders into the
//     release's manifests, with checksums that match.
//
// It is a Go module of its own so that Helm's and the API server's dependency graph stays out of
// the protocol conformance module next to it.
package deploy
