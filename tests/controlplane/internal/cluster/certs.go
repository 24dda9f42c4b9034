package cluster

import (
	"fmt"
	"os/exec"
	"path/filepath"
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

	newKey := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"}
	steps := [][]string{
		append(append([]string{"req", "-x509"}, newKey...), "-keyout", p.CAKey, "-out", p.CA,
			"-subj", "/CN=resmgr-e2e-ca"),
		p.leaf(newKey, p.Serving, p.ServingKey, "/CN=kube-apiserver", "serverAuth",
			"-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
		p.leaf(newKey, p.Admin, p.AdminKey, "/O=system:masters/CN=resmgr-e2e-admin", "clientAuth"),
		p.leaf(newKey, p.Scheduler, p.SchedulerKey, "/CN=system:kube-scheduler", "clientAuth"),
		p.leaf(newKey, p.ControllerManager, p.ControllerManagerKey, "/CN=system:kube-controller-manager", "clientAuth"),
		{"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", p.ServiceAccountKey},
		{"pkey", "-in", p.ServiceAccountKey, "-pubout", "-out", p.ServiceAccountPub},
	}
	for _, args := range steps {
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("openssl %v: %w\n%s", args, err, out)
		}
	}
	return p, nil
}

// leaf is the openssl arguments of a certificate signed by the CA.
func (p *pki) leaf(newKey []string, cert, key, subject, usage string, extra ...string) []string {
	args := append([]string{"req", "-x509"}, newKey...)
	args = append(args, "-keyout", key, "-out", cert, "-subj", subject, "-CA", p.CA, "-CAkey", p.CAKey,
		"-addext", "basicConstraints=critical,CA:FALSE",
		"-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
		"-addext", "extendedKeyUsage="+usage)
	return append(args, extra...)
}
