// Package certs makes a run's certificates and keys with openssl: P-256 keys, a CA of the
// run's own, the certificates it signs and a service account key pair. The two clusters
// (package cluster, package onenode) lay out their files, name the subjects and choose how
// long the certificates live; the openssl arguments are the same for both, so they are here.
package certs

import (
	"fmt"
	"os/exec"
	"strconv"
)

// CA is the run's certificate authority: its certificate and key files, and how many days it
// and the certificates it signs are valid.
type CA struct {
	Cert, Key string
	Days      int
}

// newKey is openssl req's arguments for a new unencrypted P-256 key, valid for the CA's days.
func (ca CA) newKey() []string {
	return []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", strconv.Itoa(ca.Days)}
}

// Root is the openssl arguments of the CA's own certificate, self-signed, and its key.
func (ca CA) Root(subject string) []string {
	return append(append([]string{"req", "-x509"}, ca.newKey()...), "-keyout", ca.Key, "-out", ca.Cert,
		"-subj", subject)
}

// Leaf is the openssl arguments of a certificate signed by the CA.
func (ca CA) Leaf(cert, key, subject, usage string, extra ...string) []string {
	args := append([]string{"req", "-x509"}, ca.newKey()...)
	args = append(args, "-keyout", key, "-out", cert, "-subj", subject, "-CA", ca.Cert, "-CAkey", ca.Key,
		"-addext", "basicConstraints=critical,CA:FALSE",
		"-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
		"-addext", "extendedKeyUsage="+usage)
	return append(args, extra...)
}

// ServiceAccount is the openssl steps of the service account key pair: key signs the tokens,
// pub verifies them.
func ServiceAccount(key, pub string) [][]string {
	return [][]string{
		{"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key},
		{"pkey", "-in", key, "-pubout", "-out", pub},
	}
}

// Run runs openssl with each step's arguments, in order, until one fails.
func Run(steps [][]string) error {
	for _, args := range steps {
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("openssl %v: %w\n%s", args, err, out)
		}
	}
	return nil
}
