// Command cluster starts and stops the one-node cluster with resmgr installed that
// `cargo xtask cluster up|down` gives users (package onenode); the xtask builds what it needs
// and passes it in the environment.
//
//	cluster up     start it (one per machine), print the KUBECONFIG to use
//	cluster down   take it down: processes, cgroups, namespaces, the host link, its directory
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// dir is the user's cluster's run directory: one per machine, so that `down` finds it.
var dir = filepath.Join(os.TempDir(), "resmgr-cluster-up")

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: cluster up|down")
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	switch args[0] {
	case "up":
		if _, err := os.Stat(dir); err == nil {
			return fmt.Errorf("a cluster is already up in %s: `cargo xtask cluster down` first", dir)
		}
		cfg, err := onenode.ConfigFromEnv()
		if err != nil {
			return err
		}
		n, err := onenode.Up(cfg, onenode.Options{Detach: true, Dir: dir, Logf: logf})
		if err != nil {
			return err
		}
		logf("\nresmgr runs as the DaemonSet %s/%s on node %s (%s), with no CPU request: it runs on the CPU the kubelet reserves, %s. Use the cluster with:\n",
			onenode.Namespace, onenode.Release, onenode.NodeName, n.Runtime(), onenode.ReservedCPUs)
		fmt.Printf("export KUBECONFIG=%s\n", n.Kubeconfig)
		logf("\nand claim a CPU: kubectl apply -f examples/kubernetes/claim-1-cpu.yaml; kubectl logs dra-pinned-one-cpu")
		logf("\nkubectl of the cluster's version: %s/kubectl; helm: %s; the cluster's logs: %s/logs.\n"+
			"Take it all down with `cargo xtask cluster down`.", os.Getenv(onenode.EnvControlPlane), os.Getenv(onenode.EnvHelm), dir)
		return nil
	case "down":
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			logf("no cluster is up (%s does not exist)", dir)
			return nil
		}
		if err := onenode.Down(dir, false); err != nil {
			return err
		}
		logf("cluster down: nothing of it is left")
		return nil
	}
	return fmt.Errorf("unknown command %q: usage: cluster up|down", args[0])
}
