// Package cluster runs a real Kubernetes control plane on loopback for one test: etcd,
// kube-apiserver, kube-scheduler and kube-controller-manager, built from the pinned module in
// tests/controlplane/build, with certificates made by openssl for this run only.
//
// There is no kubelet: the tests' nodes are Node objects (Node registers one as a kubelet
// would), so that a scenario can have any machine and any number of nodes, whatever machine
// runs it. The controller-manager runs only the controllers that work without a kubelet (the
// caller names them: Scenarios, or fewer): the service account controller makes each
// namespace's `default` ServiceAccount, the DaemonSet controller makes the agent's pod for a
// node, and the resource claim controller releases a pod's claims when the pod goes. The node
// lifecycle controller stays off: without a kubelet's heartbeats it would mark every node
// unreachable and evict its pods, so Node clears the not-ready taint itself.
//
// Every run has its own directory, ports and processes; processes are stopped by PID when the
// test ends (and die with the test binary), so runs of other engineers on the same machine never
// collide with this one.
package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// EnvBinDir names the directory holding etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager and kubectl.
const EnvBinDir = "RESMGR_CONTROLPLANE_BIN_DIR"

// startLimit bounds the wait for each component to come up.
const startLimit = 90 * time.Second

// Binaries are the control plane's programs.
type Binaries struct {
	Etcd, APIServer, Scheduler, ControllerManager, Kubectl string
}

// BinariesFromEnv finds the programs in $RESMGR_CONTROLPLANE_BIN_DIR, failing with what to do
// when it is unset or incomplete.
func BinariesFromEnv() (Binaries, error) {
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		return Binaries{}, fmt.Errorf("%s is not set: run these tests with `cargo xtask e2e --stage controlplane`, "+
			"which builds the control plane (tests/controlplane/build) and sets it", EnvBinDir)
	}
	b := Binaries{
		Etcd:      filepath.Join(dir, "etcd"),
		APIServer: filepath.Join(dir, "kube-apiserver"),
		Scheduler: filepath.Join(dir, "kube-scheduler"),
		Kubectl:   filepath.Join(dir, "kubectl"),
		// The controller-manager of the same build.
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
	}
	for _, p := range []string{b.Etcd, b.APIServer, b.Scheduler, b.ControllerManager, b.Kubectl} {
		if _, err := os.Stat(p); err != nil {
			return Binaries{}, fmt.Errorf("%s (from %s): %w", p, EnvBinDir, err)
		}
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		return Binaries{}, fmt.Errorf("the control plane's certificates are made with openssl, which is not on PATH (apt-get install openssl)")
	}
	return b, nil
}

// Gates are feature gates given to kube-apiserver, kube-scheduler and kube-controller-manager.
type Gates map[string]bool

func (g Gates) flag() string {
	var parts []string
	for name, on := range g {
		parts = append(parts, name+"="+strconv.FormatBool(on))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Cluster is a running control plane.
type Cluster struct {
	t    testing.TB
	bins Binaries
	// Dir holds the run's certificates, kubeconfigs, etcd data and logs.
	Dir string
	pki *pki

	etcd, apiserver, scheduler, controllerManager *Process
	etcdURL                                       string
	port                                          int
	opts                                          Options

	// Server is the API server's URL.
	Server string
	// AdminKubeconfig is a kubeconfig of a system:masters client.
	AdminKubeconfig string
	// Admin is a client of the API server as system:masters.
	Admin kubernetes.Interface
	// AdminConfig is Admin's configuration.
	AdminConfig *rest.Config
}

// The controllers of kube-controller-manager the scenarios use.
const (
	// ServiceAccountController makes every namespace's `default` ServiceAccount, without which
	// the ServiceAccount admission plugin refuses pods there.
	ServiceAccountController = "serviceaccount-controller"
	// DaemonSetController makes a DaemonSet's pod for each node.
	DaemonSetController = "daemonset-controller"
	// ResourceClaimController makes claims from templates, and takes a pod that has gone out
	// of its claims' reservedFor, deallocating a claim no one reserves any more.
	ResourceClaimController = "resourceclaim-controller"
)

// Scenarios are the controllers the scenarios need.
var Scenarios = []string{ServiceAccountController, DaemonSetController, ResourceClaimController}

// Options of a control plane.
type Options struct {
	// Gates are the feature gates of every component.
	Gates Gates
	// SchedulerArgs are more kube-scheduler flags (the scale benchmark lifts its client's rate
	// limit).
	SchedulerArgs []string
	// SchedulerConfig, when set, is kube-scheduler's KubeSchedulerConfiguration (YAML) for its
	// kubeconfig file; the scheduler then reads its client settings and leader election from
	// it, and --kubeconfig and --leader-elect are not given.
	SchedulerConfig func(kubeconfig string) string
	// Controllers are kube-controller-manager's controllers; at least one.
	Controllers []string
}

// Start brings up etcd, kube-apiserver, kube-scheduler and kube-controller-manager with the
// scenarios' controllers, all with gates, and waits until the API server is ready.
func Start(t testing.TB, gates Gates) *Cluster {
	t.Helper()
	return StartWith(t, Options{Gates: gates, Controllers: Scenarios})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Cluster {
	t.Helper()
	if len(o.Controllers) == 0 {
		t.Fatal("a control plane needs at least one controller of kube-controller-manager")
	}
	bins, err := BinariesFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "resmgr-cp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the control plane's files and logs are kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	c := &Cluster{t: t, bins: bins, Dir: dir, opts: o}
	if c.pki, err = makePKI(dir); err != nil {
		t.Fatal(err)
	}
	c.startEtcd()
	c.port = freePort(t)
	c.Server = fmt.Sprintf("https://127.0.0.1:%d", c.port)
	c.AdminKubeconfig = c.writeKubeconfig("admin.kubeconfig", &clientcmdapi.AuthInfo{
		ClientCertificate: c.pki.Admin, ClientKey: c.pki.AdminKey})
	c.writeKubeconfig("scheduler.kubeconfig", &clientcmdapi.AuthInfo{
		ClientCertificate: c.pki.Scheduler, ClientKey: c.pki.SchedulerKey})
	c.writeKubeconfig("controller-manager.kubeconfig", &clientcmdapi.AuthInfo{
		ClientCertificate: c.pki.ControllerManager, ClientKey: c.pki.ControllerManagerKey})
	c.AdminConfig = &rest.Config{Host: c.Server, QPS: 200, Burst: 400, Timeout: 30 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.pki.CA, CertFile: c.pki.Admin, KeyFile: c.pki.AdminKey}}
	if c.Admin, err = kubernetes.NewForConfig(c.AdminConfig); err != nil {
		t.Fatal(err)
	}
	c.startAPIServer()
	c.startScheduler()
	c.startControllerManager()
	return c
}

func (c *Cluster) path(name string) string { return filepath.Join(c.Dir, name) }

func (c *Cluster) startEtcd() {
	client, peer := freePort(c.t), freePort(c.t)
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	c.etcd = Spawn(c.t, c.Dir, "etcd", c.bins.Etcd,
		"--name=e2e", "--data-dir="+c.path("etcd"),
		"--listen-client-urls="+c.etcdURL, "--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL,
		// A test's data need not survive a power cut; fsync on a shared disk is slow.
		"--unsafe-no-fsync", "--log-level=warn")
	err := c.etcd.waitReady(startLimit, func() error {
		resp, err := http.Get(c.etcdURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/health: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
}

func (c *Cluster) startAPIServer() {
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.port), "--cert-dir=" + c.path("apiserver-certs"),
		"--tls-cert-file=" + c.pki.Serving, "--tls-private-key-file=" + c.pki.ServingKey,
		"--client-ca-file=" + c.pki.CA,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.pki.ServiceAccountPub,
		"--service-account-signing-key-file=" + c.pki.ServiceAccountKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		// The default service's endpoints would name a loopback address, which Endpoints refuse.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	if len(c.opts.Gates) > 0 {
		args = append(args, "--feature-gates="+c.opts.Gates.flag())
	}
	c.apiserver = Spawn(c.t, c.Dir, "kube-apiserver", c.bins.APIServer, args...)
	err := c.apiserver.waitReady(startLimit, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		body, err := c.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%v: %s", err, body)
		}
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
}

func (c *Cluster) startScheduler() {
	args := []string{
		"--kubeconfig=" + c.path("scheduler.kubeconfig"),
		"--leader-elect=false",
	}
	if c.opts.SchedulerConfig != nil {
		config := c.path("scheduler-config.yaml")
		if err := os.WriteFile(config, []byte(c.opts.SchedulerConfig(c.path("scheduler.kubeconfig"))), 0o600); err != nil {
			c.t.Fatal(err)
		}
		args = []string{"--config=" + config}
	}
	// No HTTPS endpoint: nothing here reads it, and a fixed default port would collide with
	// other runs on the machine.
	args = append(args, "--secure-port=0")
	args = append(args, c.opts.SchedulerArgs...)
	if len(c.opts.Gates) > 0 {
		args = append(args, "--feature-gates="+c.opts.Gates.flag())
	}
	c.scheduler = Spawn(c.t, c.Dir, "kube-scheduler", c.bins.Scheduler, args...)
}

func (c *Cluster) startControllerManager() {
	args := []string{
		"--kubeconfig=" + c.path("controller-manager.kubeconfig"),
		"--leader-elect=false",
		"--secure-port=0",
		"--controllers=" + strings.Join(c.opts.Controllers, ","),
		// Each controller acts as its own service account, with the bootstrap policy's role
		// for it, as in a cluster kubeadm makes.
		"--use-service-account-credentials=true",
		// Under the run's directory: it would create /usr/libexec/kubernetes otherwise.
		"--flex-volume-plugin-dir=" + c.path("flexvolume"),
	}
	if len(c.opts.Gates) > 0 {
		args = append(args, "--feature-gates="+c.opts.Gates.flag())
	}
	c.controllerManager = Spawn(c.t, c.Dir, "kube-controller-manager", c.bins.ControllerManager, args...)
}

// Restart stops kube-controller-manager, kube-scheduler and kube-apiserver and starts them
// again on the same port and etcd with other feature gates, as an operator does who changes a
// gate.
func (c *Cluster) Restart(gates Gates) {
	c.t.Helper()
	began := time.Now()
	c.controllerManager.Stop()
	c.scheduler.Stop()
	// The API server drains its clients' watches for longer than a test wants to wait; what
	// it holds is in etcd either way.
	c.apiserver.StopWithin(2 * time.Second)
	c.opts.Gates = gates
	c.startAPIServer()
	c.startScheduler()
	c.startControllerManager()
	c.t.Logf("control plane: restarted with gates %s in %s", gates.flag(), time.Since(began))
}

// PIDs are kube-apiserver's and kube-scheduler's process IDs, to measure them by.
func (c *Cluster) PIDs() (apiserver, scheduler int) {
	return c.apiserver.PID(), c.scheduler.PID()
}

// SchedulerLog is the end of kube-scheduler's log, for failure messages.
func (c *Cluster) SchedulerLog() string { return c.scheduler.Tail(40) }

// Alive fails the test if a control plane process has exited.
func (c *Cluster) Alive() {
	c.t.Helper()
	for _, p := range []*Process{c.etcd, c.apiserver, c.scheduler, c.controllerManager} {
		if !p.Running() {
			c.t.Fatalf("%s exited (%v); its log ends:\n%s", p.Name, p.ExitError(), p.Tail(30))
		}
	}
}

// writeKubeconfig writes a kubeconfig for the API server with user's credentials and returns
// its path.
func (c *Cluster) writeKubeconfig(name string, user *clientcmdapi.AuthInfo) string {
	c.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthority: c.pki.CA}
	cfg.AuthInfos["user"] = user
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "user"}
	cfg.CurrentContext = "e2e"
	path := c.path(name)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		c.t.Fatal(err)
	}
	return path
}

// TokenKubeconfig writes a kubeconfig that authenticates with a bearer token and returns its
// path.
func (c *Cluster) TokenKubeconfig(name, token string) string {
	return c.writeKubeconfig(name, &clientcmdapi.AuthInfo{Token: token})
}

// Kubectl runs the built kubectl as the admin and returns its standard output.
func (c *Cluster) Kubectl(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(c.bins.Kubectl, append([]string{"--kubeconfig=" + c.AdminKubeconfig}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// freePort asks the kernel for a free loopback port. Another process could take it before our
// child binds it; the ports come from the kernel's ephemeral range, which makes that unlikely,
// and a child that cannot bind fails the test loudly rather than joining another run.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
