package onenode

// The cluster's certificates and keys: their files and subjects (package certs makes them).

import (
	"fmt"
	"path/filepath"

	"github.com/resmgr/resmgr/tests/controlplane/internal/certs"
)

// pki is the run's certificates and keys, made with openssl: P-256 keys valid for 30 days (a
// user's cluster lives longer than a test).
type pki struct {
	CA, CAKey string
	// Serving is the API server's certificate: for the node's address (where the pods reach
	// it, without kube-proxy), the kubernetes Service's names and loopback.
	Serving, ServingKey string
	// KubeletClient is the API server's client for the kubelet (logs, exec), in system:masters.
	KubeletClient, KubeletClientKey string
	// ServiceAccountKey signs service account tokens; ServiceAccountPub verifies them.
	ServiceAccountKey, ServiceAccountPub string
	// Client certificates by name: admin, scheduler, controller-manager, kubelet.
	clients map[string][2]string
}

// clientSubjects are the identities of the run's clients. The kubelet's is the one the Node
// authorizer and NodeRestriction admit for its node.
func clientSubjects(node string) map[string]string {
	return map[string]string{
		"admin":              "/O=system:masters/CN=resmgr-cluster-admin",
		"scheduler":          "/CN=system:kube-scheduler",
		"controller-manager": "/CN=system:kube-controller-manager",
		"kubelet":            "/O=system:nodes/CN=system:node:" + node,
	}
}

func makePKI(dir, node, nodeIP string) (*pki, error) {
	f := func(name string) string { return filepath.Join(dir, name) }
	p := &pki{clients: map[string][2]string{}}
	p.CA, p.CAKey = f("ca.crt"), f("ca.key")
	p.Serving, p.ServingKey = f("apiserver.crt"), f("apiserver.key")
	p.KubeletClient, p.KubeletClientKey = f("apiserver-kubelet-client.crt"), f("apiserver-kubelet-client.key")
	p.ServiceAccountKey, p.ServiceAccountPub = f("sa.key"), f("sa.pub")
	ca := certs.CA{Cert: p.CA, Key: p.CAKey, Days: 30}
	steps := [][]string{
		ca.Root("/CN=resmgr-cluster-ca"),
		ca.Leaf(p.Serving, p.ServingKey, "/CN=kube-apiserver", "serverAuth",
			"-addext", fmt.Sprintf("subjectAltName=IP:%s,IP:%s,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"+
				"DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local", nodeIP, serviceIP)),
		ca.Leaf(p.KubeletClient, p.KubeletClientKey, "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth"),
	}
	steps = append(steps, certs.ServiceAccount(p.ServiceAccountKey, p.ServiceAccountPub)...)
	for name, subject := range clientSubjects(node) {
		cert, key := f(name+".crt"), f(name+".key")
		p.clients[name] = [2]string{cert, key}
		steps = append(steps, ca.Leaf(cert, key, subject, "clientAuth"))
	}
	if err := certs.Run(steps); err != nil {
		return nil, err
	}
	return p, nil
}
