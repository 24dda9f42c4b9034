package onenode

// The TestMain of the scenario packages whose tests share one cluster (clusterscenarios,
// nodev2scenarios): up, the tests, down, and what a failure leaves to look at.

import (
	"fmt"
	"os"
)

// RunTests is the TestMain of a package whose tests run on one cluster, one after the other: it
// brings the cluster up with the environment's Config (ConfigFromEnv) and o, its progress on
// stderr unless o.Logf says otherwise, hands the node to ready, runs the tests and takes the
// cluster down; the exit code, for os.Exit. After a failure the node's Diagnostics are printed
// and the cluster's files and logs kept. Down must leave nothing of the run on the machine
// (its directory only when kept): whatever it leaves fails the run. m is the package's
// *testing.M; taking it as an interface keeps package testing out of `cargo xtask cluster`'s
// binary, which links this package.
func RunTests(m interface{ Run() int }, o Options, ready func(*Node)) int {
	cfg, err := ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if o.Logf == nil {
		o.Logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	}
	node, err := Up(cfg, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bringing up the cluster:", err)
		return 1
	}
	ready(node)
	code := m.Run()
	keep := code != 0
	if keep {
		fmt.Fprintln(os.Stderr, node.Diagnostics())
		fmt.Fprintf(os.Stderr, "the cluster's files and logs are kept in %s\n", node.Dir())
	}
	if err := node.Close(keep); err != nil {
		fmt.Fprintln(os.Stderr, "taking the cluster down:", err)
		code = 1
	}
	for _, left := range node.Leftovers() {
		if keep && left == "directory "+node.Dir() {
			continue
		}
		fmt.Fprintln(os.Stderr, "left behind after the cluster was taken down:", left)
		code = 1
	}
	return code
}
