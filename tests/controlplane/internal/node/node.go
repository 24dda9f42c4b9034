// Package node is one worker node of the e2e cluster without a kubelet: `resmgr run` (the
// agent under test), the container runtime's NRI side it plugs into, and the kubelet's part
// played with the kubelet's own generated clients: plugin registration over the registration
// socket, NodePrepareResources and NodeUnprepareResources over the real DRA socket, and the
// CDI injection a runtime does with the CDI cache runtimes use.
package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/gokit/kubeletplay"
)

// Driver is the agent's DRA driver name, as in the chart.
const Driver = "topology-aware.resmgr.io"

// EnvBinDir names the directory of the workspace's binaries (`resmgr`).
const EnvBinDir = "RESMGR_BIN_DIR"

// Config is how the agent runs.
type Config struct {
	// Name is the node's name.
	Name string
	// Kubeconfig is the agent's kubeconfig (its pod-bound token).
	Kubeconfig string
	// Topology is `synthetic:<hwloc description>` (or `live`).
	Topology string
	// Reserved is --reserved-cpus.
	Reserved string
	// Args are more flags of `resmgr run`.
	Args []string
}

// Node is the agent with its runtime and kubelet.
type Node struct {
	t       testing.TB
	cfg     Config
	dir     string
	bin     string
	runtime containerRuntime
	agent   *cluster.Process
	metrics string
	// debug serves /debug/state: its own listener when the agent has --debug-addr, else metrics.
	debug string
	dra   drav1.DRAPluginClient
	// prepared maps a pod UID to the CDI devices of its prepared claims, by claim name.
	prepared map[string]map[string][]string
}

// Start brings up the runtime and the agent, registers the agent like the kubelet does, and
// waits for /readyz.
func Start(t testing.TB, cfg Config) *Node {
	t.Helper()
	binDir := os.Getenv(EnvBinDir)
	if binDir == "" {
		t.Fatalf("%s is not set: run these tests with `cargo xtask e2e --stage controlplane`, which builds resmgr and sets it", EnvBinDir)
	}
	bin := filepath.Join(binDir, "resmgr")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the agent binary: %v", err)
	}
	dir, err := os.MkdirTemp("", "resmgr-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the node's files and the agent's log are kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	n := &Node{t: t, cfg: cfg, dir: dir, bin: bin, prepared: map[string]map[string][]string{}}
	n.runtime = startNRIRuntime(t, dir)
	n.StartAgent()
	return n
}

func (n *Node) path(p ...string) string { return filepath.Join(append([]string{n.dir}, p...)...) }

// StartAgent starts `resmgr run` (again, after StopAgent), registers it and waits until ready.
func (n *Node) StartAgent() {
	n.t.Helper()
	n.metrics = freeAddr(n.t)
	n.debug = n.metrics
	var debugArgs []string
	if hasFlag(n.t, n.bin, "--debug-addr") {
		// Its default is a fixed loopback port, which other runs on the machine would share.
		n.debug = freeAddr(n.t)
		debugArgs = []string{"--debug-addr", n.debug}
	}
	args := append([]string{"run",
		"--node-name", n.cfg.Name, "--driver-name", Driver,
		"--nri-socket", n.runtime.nriSocket(), "--nri-plugin-index", "90",
		"--kubelet-plugins-dir", n.path("plugins"), "--kubelet-registry-dir", n.path("plugins_registry"),
		"--cdi-dir", n.runtime.cdiDir(), "--state-dir", n.path("state"), "--kubeconfig", n.cfg.Kubeconfig,
		"--topology", n.cfg.Topology, "--reserved-cpus", n.cfg.Reserved,
		"--metrics-addr", n.metrics}, debugArgs...)
	args = append(args, n.cfg.Args...)
	n.agent = cluster.Spawn(n.t, n.dir, "resmgr", n.bin, args...)
	n.t.Cleanup(func() {
		if n.t.Failed() {
			n.t.Logf("resmgr run's log ends:\n%s", n.agent.Tail(40))
		}
	})
	if err := n.runtime.waitPlugin(n.agent.Exited()); err != nil {
		n.t.Fatalf("resmgr run: %v (%v):\n%s", err, n.agent.ExitError(), n.agent.Tail(30))
	}
	n.dra = n.register()
	n.waitFor("/readyz to say ready", func() bool {
		code, _ := get("http://" + n.metrics + "/readyz")
		return code == http.StatusOK
	})
}

// StopAgent sends SIGTERM and waits for the agent to exit 0.
func (n *Node) StopAgent() {
	n.t.Helper()
	if err := n.agent.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatal(err)
	}
	select {
	case <-n.agent.Exited():
		if err := n.agent.ExitError(); err != nil {
			n.t.Fatalf("resmgr run exited with %v after SIGTERM", err)
		}
	case <-time.After(cluster.WaitLimit):
		n.t.Fatal("resmgr run did not stop after SIGTERM")
	}
}

// RestartAgent stops the agent (SIGTERM) and starts it again with these extra flags.
func (n *Node) RestartAgent(args ...string) {
	n.t.Helper()
	n.StopAgent()
	n.cfg.Args = args
	n.StartAgent()
}

// Log is the agent's whole log.
func (n *Node) Log() string {
	data, _ := os.ReadFile(n.agent.Log)
	return string(data)
}

// register plays the kubelet's plugin watcher (kubeletplay.Register), then dials the DRA
// endpoint the way kubelets from 1.34 do.
func (n *Node) register() drav1.DRAPluginClient {
	n.t.Helper()
	socket := n.path("plugins_registry", Driver+"-reg.sock")
	n.waitFor("the registration socket", func() bool { _, err := os.Stat(socket); return err == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := kubeletplay.Register(ctx, socket, func(info *registerapi.PluginInfo) error {
		if info.Type != "DRAPlugin" || info.Name != Driver {
			return fmt.Errorf("want a DRAPlugin named %s", Driver)
		}
		return nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	dra, conn, err := kubeletplay.DRAClient(info.Endpoint)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { conn.Close() })
	return dra
}

// waitFor polls cond every 20 ms until it holds, failing the test if the agent exits or the
// wait limit passes: files and sockets appear in the agent's own time, with no other signal.
func (n *Node) waitFor(what string, cond func() bool) {
	n.t.Helper()
	deadline := time.Now().Add(cluster.WaitLimit)
	for !cond() {
		select {
		case <-n.agent.Exited():
			n.t.Fatalf("resmgr run exited (%v) while waiting for %s:\n%s", n.agent.ExitError(), what, n.agent.Tail(30))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("timed out waiting for %s; resmgr run's log ends:\n%s", what, n.agent.Tail(30))
		}
	}
}

// PreparedDevice is one device of a prepared claim, as the agent answered the kubelet.
type PreparedDevice struct {
	Claim   string
	Request []string
	Pool    string
	Device  string
	ShareID string
	CDI     []string
}

// Prepare plays the kubelet's pod sync for a pod the scheduler bound here: it reads the pod's
// claims (which must be allocated and reserved for the pod, as the kubelet checks) and asks the
// agent to prepare them in one NodePrepareResources call. It returns the answer per claim name;
// a claim the agent refused is an error naming it.
func (n *Node) Prepare(client kubernetes.Interface, pod *corev1.Pod) (map[string][]PreparedDevice, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var req drav1.NodePrepareResourcesRequest
	names := map[string]string{}
	for _, claim := range podClaims(n.t, client, pod) {
		if claim.Status.Allocation == nil {
			return nil, fmt.Errorf("claim %s of pod %s is not allocated", claim.Name, pod.Name)
		}
		reserved := false
		for _, r := range claim.Status.ReservedFor {
			reserved = reserved || r.UID == pod.UID
		}
		if !reserved {
			return nil, fmt.Errorf("claim %s is not reserved for pod %s", claim.Name, pod.Name)
		}
		req.Claims = append(req.Claims, &drav1.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)})
		names[string(claim.UID)] = claim.Name
	}
	resp, err := n.dra.NodePrepareResources(ctx, &req)
	if err != nil {
		return nil, fmt.Errorf("NodePrepareResources for pod %s: %w", pod.Name, err)
	}
	out := map[string][]PreparedDevice{}
	cdiByClaim := map[string][]string{}
	var failures []string
	for uid, name := range names {
		answer, ok := resp.Claims[uid]
		switch {
		case !ok:
			failures = append(failures, fmt.Sprintf("claim %s: no answer", name))
			continue
		case answer.Error != "":
			failures = append(failures, fmt.Sprintf("claim %s: %s", name, answer.Error))
			continue
		}
		for _, d := range answer.Devices {
			out[name] = append(out[name], PreparedDevice{Claim: name, Request: d.RequestNames, Pool: d.PoolName,
				Device: d.DeviceName, ShareID: d.GetShareId(), CDI: d.CdiDeviceIds})
			cdiByClaim[name] = append(cdiByClaim[name], d.CdiDeviceIds...)
		}
	}
	if len(failures) > 0 {
		return out, fmt.Errorf("the agent refused claims of pod %s: %s", pod.Name, strings.Join(failures, "; "))
	}
	n.prepared[string(pod.UID)] = cdiByClaim
	return out, nil
}

// Unprepare plays the kubelet when the pod has gone: NodeUnprepareResources for its claims.
func (n *Node) Unprepare(client kubernetes.Interface, pod *corev1.Pod) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if err := n.runtime.removePod(ctx, pod); err != nil {
		n.t.Fatal(err)
	}
	var req drav1.NodeUnprepareResourcesRequest
	for _, claim := range podClaims(n.t, client, pod) {
		req.Claims = append(req.Claims, &drav1.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)})
	}
	resp, err := n.dra.NodeUnprepareResources(ctx, &req)
	if err != nil {
		n.t.Fatalf("NodeUnprepareResources for pod %s: %v", pod.Name, err)
	}
	for _, c := range req.Claims {
		if a := resp.Claims[c.Uid]; a == nil || a.Error != "" {
			n.t.Fatalf("unprepare of claim %s answered %+v", c.Name, a)
		}
	}
	delete(n.prepared, string(pod.UID))
}

// Container is a container as the runtime created it.
type Container struct {
	ID string
	// PID is its process on a real runtime (0 with the NRI library).
	PID  int
	Cpus string
	Mems string
	// Env is its environment from the CDI devices (on a real runtime: all of it, as the
	// kernel shows it).
	Env []string
}

// RunContainers creates the pod's containers through the runtime, as the kubelet asks for
// them: each container gets the CDI devices of the claims it references (all devices of a
// claim; the requests it names are our claims' only requests).
func (n *Node) RunContainers(pod *corev1.Pod) map[string]Container {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := map[string]Container{}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		var devices []string
		for _, ref := range c.Resources.Claims {
			claimName := ""
			for _, pc := range pod.Spec.ResourceClaims {
				if pc.Name == ref.Name && pc.ResourceClaimName != nil {
					claimName = *pc.ResourceClaimName
				}
			}
			for _, s := range pod.Status.ResourceClaimStatuses {
				if claimName == "" && s.Name == ref.Name && s.ResourceClaimName != nil {
					claimName = *s.ResourceClaimName
				}
			}
			devices = append(devices, n.prepared[string(pod.UID)][claimName]...)
		}
		ctr, err := n.runtime.createContainer(ctx, pod, c, devices)
		if err != nil {
			n.t.Fatalf("pod %s container %s: %v", pod.Name, c.Name, err)
		}
		out[c.Name] = ctr
	}
	return out
}

// Cpusets is every running container's current cpuset (after the agent's updates), by ID.
func (n *Node) Cpusets() map[string]string { return n.runtime.cpusets() }

// DebugState is the agent's /debug/state.
func (n *Node) DebugState() map[string]any {
	n.t.Helper()
	code, body := get("http://" + n.debug + "/debug/state")
	if code != http.StatusOK {
		n.t.Fatalf("/debug/state answered %d: %s", code, body)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		n.t.Fatalf("/debug/state: %v", err)
	}
	return out
}

// Metrics is the agent's /metrics text.
func (n *Node) Metrics() string {
	_, body := get("http://" + n.metrics + "/metrics")
	return body
}

// Alive fails the test if the agent has exited.
func (n *Node) Alive() {
	n.t.Helper()
	if !n.agent.Running() {
		n.t.Fatalf("resmgr run exited (%v):\n%s", n.agent.ExitError(), n.agent.Tail(30))
	}
}

func podClaims(t testing.TB, client kubernetes.Interface, pod *corev1.Pod) []*resourcev1.ResourceClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*resourcev1.ResourceClaim
	for _, ref := range pod.Spec.ResourceClaims {
		name := ref.ResourceClaimName
		// A claim from a template: the one the resource claim controller made, as the pod's
		// status names it (the kubelet reads it there too).
		for _, s := range pod.Status.ResourceClaimStatuses {
			if name == nil && s.Name == ref.Name {
				name = s.ResourceClaimName
			}
		}
		if name == nil {
			t.Fatalf("pod %s: claim %s comes from a template, and the pod's status names no claim made from it", pod.Name, ref.Name)
		}
		claim, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading claim %s of pod %s: %v", *name, pod.Name, err)
		}
		out = append(out, claim)
	}
	return out
}

// hasFlag reports whether `resmgr run` takes flag, from its help.
func hasFlag(t testing.TB, bin, flag string) bool {
	t.Helper()
	out, err := exec.Command(bin, "run", "--help").Output()
	if err != nil {
		t.Fatalf("resmgr run --help: %v", err)
	}
	return strings.Contains(string(out), flag+" ")
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
