package cluster

// The test cluster's certificates and keys: their files and subjects (package certs makes them).

import (
	"path/filepath"

	"github.com/resmgr/resmgr/tests/controlplane/internal/certs"
)

// pki is the run's certificates and keys, made with openssl: P-256 keys, valid for two days.
type pki struct {
	dir string
	// CA signs every certificate; the API server trusts client certificates it signed.
	CA, CAKey string
	// Serving is the API server's certificate, for 127.0.0.1 and localhost.
	Serving, ServingKey string
	// Admin is a client in system:masters, for the test.
	Admin, AdminKey string
	// Scheduler is the client system:kube-scheduler, bound by the bootstrap RBAC policy.
	Scheduler, SchedulerKey string
	// ControllerManager is the client system:kube-controller-manager, which the bootstrap
	// policy lets make each controller's service account credentials.
	ControllerManager, ControllerManagerKey string
	// ServiceAccountKey signs service account tokens; ServiceAccountPub verifies them.
	ServiceAccountKey, ServiceAccountPub string
}

func makePKI(dir string) (*pki, error) {
	p := &pki{dir: dir}
	f := func(name string) string { return filepath.Join(dir, name) }
	p.CA, p.CAKey = f("ca.crt"), f("ca.key")
	p.Serving, p.ServingKey = f("apiserver.crt"), f("apiserver.key")
	p.Admin, p.AdminKey = f("admin.crt"), f("admin.key")
	p.Scheduler, p.SchedulerKey = f("scheduler.crt"), f("scheduler.key")
	p.ControllerManager, p.ControllerManagerKey = f("controller-manager.crt"), f("controller-manager.key")
	p.ServiceAccountKey, p.ServiceAccountPub = f("sa.key"), f("sa.pub")

	ca := certs.CA{Cert: p.CA, Key: p.CAKey, Days: 2}
	steps := [][]string{
		ca.Root("/CN=resmgr-e2e-ca"),
		ca.Leaf(p.Serving, p.ServingKey, "/CN=kube-apiserver", "serverAuth",
			"-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
		ca.Leaf(p.Admin, p.AdminKey, "/O=system:masters/CN=resmgr-e2e-admin", "clientAuth"),
		ca.Leaf(p.Scheduler, p.SchedulerKey, "/CN=system:kube-scheduler", "clientAuth"),
		ca.Leaf(p.ControllerManager, p.ControllerManagerKey, "/CN=system:kube-controller-manager", "clientAuth"),
	}
	steps = append(steps, certs.ServiceAccount(p.ServiceAccountKey, p.ServiceAccountPub)...)
	if err := certs.Run(steps); err != nil {
		return nil, err
	}
	return p, nil
}
