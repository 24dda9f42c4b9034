// The whole agent, end to end, against the real peers: `resmgr run` registers with containerd's
// own NRI runtime side (pkg/adaptation, with a fake runtime behind it), with a kubelet made of
// the kubelet's generated gRPC clients dialed the way the kubelet dials, and with an API server
// (resmgr's fake, driven through kube-rs); the claim it grants is resolved by the CDI cache the
// runtimes use. A claim's configuration, served the way the API server serves it, is honoured or
// refused by name. Nothing here is a double of our own code.
package agent

import (
	"bufio"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resmgr/resmgr/tests/conformance/internal/harness"
	"github.com/resmgr/resmgr/tests/conformance/internal/rustbin"
	"github.com/resmgr/resmgr/tests/gokit/kubeletplay"
)

const (
	driver   = "topology-aware.resmgr.io"
	node     = "node-a"
	claimUID = "c0ffee00-0000-4000-8000-000000000001"
	podDB    = "pod-db-uid"
	podCache = "pod-cache-uid"
	// Claims of the cache pod carrying configuration: memory pinning off, and a typo.
	unpinnedUID = "c0ffee00-0000-4000-8000-000000000002"
	typoUID     = "c0ffee00-0000-4000-8000-000000000003"
	// A claim the resource claim controller made from a template for the cache pod, which the
	// pod names "cpus" (metadata_test.go).
	templateUID = "c0ffee00-0000-4000-8000-000000000004"
	// waitLimit bounds every wait for the agent's reaction; reaching it is a failure.
	waitLimit = 30 * time.Second
)

// cluster is what the agent runs against.
type cluster struct {
	t       testing.TB
	dra     bool
	dir     string
	runtime *adaptation.Adaptation
	// cut makes the runtime go away, as if it exited.
	cut     func()
	active  chan int
	updates chan []*api.ContainerUpdate
	agent   *exec.Cmd
	exited  chan error
	logs    *harness.LockedBuffer
	metrics string
	// args are the agent's, for restarts.
	args []string
	// crashAt is the point the agent aborts at (setup.crashAt), for restarts.
	crashAt string
	// holdAt is the point the agent stops at (setup.holdAt).
	holdAt *hold
	// mu guards what the runtime reports at Synchronize and which updates it refuses.
	mu sync.Mutex
	// running and containers are what the runtime reports at Synchronize, besides web's app.
	running    []*api.PodSandbox
	containers []*api.Container
	// refuse names containers whose updates the runtime fails.
	refuse map[string]bool
	// creating names containers the runtime is creating and starting: it skips their updates and
	// reports them as applied (see creating_test.go).
	creating map[string]bool
	// applied is the cpuset the runtime last applied to each container by an update.
	applied map[string]string
	// synced are the updates of the last Synchronize reply, which the runtime drops (see
	// creating_test.go).
	synced []*api.ContainerUpdate
	// duringSync, when set, runs once inside the next Synchronize, before the runtime lists its
	// containers, as a CRI-O does whatever it is doing meanwhile (see unlisted_test.go).
	duringSync func(ctx context.Context)
	// locks, when set, are the locks of a runtime on NRI v0.11 (see lockorder_test.go), which
	// UpdateContainers takes.
	locks *v011Locks
	// api sends commands to the fake API server; answers reads its answers.
	api     io.Writer
	answers *bufio.Reader
}

// pluginCount reports the adaptation's active plugin count: the adaptation inserts a plugin
// into its invocation list only after Synchronize, and this is the signal of that.
type pluginCount chan int

func (pluginCount) RecordPluginInvocation(string, string, error)                               {}
func (pluginCount) RecordPluginLatency(string, string, time.Duration)                          {}
func (pluginCount) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {}
func (c pluginCount) UpdatePluginCount(n int)                                                  { c <- n }

func (c *cluster) path(p ...string) string { return filepath.Join(append([]string{c.dir}, p...)...) }

// start brings up the API server, the runtime (with a running web container on NUMA node 1's
// CPUs) and the agent.
func start(t *testing.T) *cluster {
	t.Helper()
	return startWith(t, true)
}

// startWith starts the agent with DRA on (and an API server for it), or off: then with no API
// server, no kubeconfig, no kubelet directories and no node name.
func startWith(t testing.TB, dra bool) *cluster {
	t.Helper()
	return startSetup(t, setup{dra: dra, topology: "pack:1 numa:2 core:4 pu:2"})
}

// setup says what the agent starts with.
type setup struct {
	dra bool
	// topology is the hwloc synthetic machine.
	topology string
	// running are the pods and containers running when the agent synchronizes, besides web's app.
	running []*api.PodSandbox
	// containers are their containers.
	containers []*api.Container
	// dropUpdates discards the runtime's unsolicited updates instead of queueing them for
	// nextUpdate (for runs that never read them).
	dropUpdates bool
	// before runs after the directories and the API server are there, before the agent starts.
	before func(c *cluster)
	// args are more arguments for the agent.
	args []string
	// crashAt names a point (crates/resmgr/src/points.rs) at which the agent aborts: it then
	// runs as resmgr-crashing (see agentBinary).
	crashAt string
	// holdAt is a point at which the agent stops until the test lets it go on: it then runs as
	// resmgr-crashing too.
	holdAt *hold
	// v011Locks makes the runtime take the locks of CRI-O on NRI v0.11 (see lockorder_test.go).
	v011Locks bool
}

// startSetup starts the agent as `s` says.
func startSetup(t testing.TB, s setup) *cluster {
	t.Helper()
	dra := s.dra
	c := &cluster{t: t, dra: dra, dir: t.TempDir(), active: make(pluginCount, 8), crashAt: s.crashAt, holdAt: s.holdAt,
		updates: make(chan []*api.ContainerUpdate, 16), logs: &harness.LockedBuffer{}}

	web := &api.PodSandbox{Id: "sb-web", Name: "web", Uid: "pod-web-uid", Namespace: "default",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-burstable-podweb.slice"}}
	app := &api.Container{Id: "web-app", PodSandboxId: "sb-web", Name: "app", State: api.ContainerState_CONTAINER_RUNNING,
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{
			Shares: &api.OptionalUInt64{Value: 512}, Cpus: "8-15", Mems: "1"}}}}
	c.running, c.containers, c.refuse, c.creating = s.running, s.containers, map[string]bool{}, map[string]bool{}
	c.applied = map[string]string{}
	if s.v011Locks {
		c.locks = newV011Locks()
	}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		c.mu.Lock()
		during := c.duringSync
		c.duringSync = nil
		c.mu.Unlock()
		if during != nil {
			during(ctx)
		}
		c.mu.Lock()
		pods := append([]*api.PodSandbox{web}, c.running...)
		containers := append([]*api.Container{app}, c.containers...)
		c.mu.Unlock()
		updates, err := cb(ctx, pods, containers)
		c.mu.Lock()
		c.synced = updates
		c.mu.Unlock()
		return err
	}
	updateFn := func(_ context.Context, u []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		if c.locks != nil {
			release, err := c.locks.aroundUpdate()
			if err != nil {
				return nil, err
			}
			defer release()
		}
		c.mu.Lock()
		var failed, applied []*adaptation.ContainerUpdate
		for _, one := range u {
			switch {
			case c.refuse[one.ContainerId]:
				failed = append(failed, one)
			case c.creating[one.ContainerId]:
				// Skipped, and not reported: what containerd does.
			default:
				applied = append(applied, one)
				if cpus := one.GetLinux().GetResources().GetCpu().GetCpus(); cpus != "" {
					c.applied[one.ContainerId] = cpus
				}
			}
		}
		c.mu.Unlock()
		if !s.dropUpdates && len(applied) != 0 {
			c.updates <- applied
		}
		return failed, nil
	}
	r, err := adaptation.New("containerd", "v2.1.0", syncFn, updateFn,
		adaptation.WithSocketPath(c.path("nri.sock")), adaptation.WithPluginPath(c.path("nri-plugins")),
		adaptation.WithPluginConfigPath(c.path("nri-conf")), adaptation.WithMetrics(pluginCount(c.active)))
	if err != nil {
		t.Fatalf("adaptation.New: %v", err)
	}
	if err := r.Start(); err != nil {
		t.Fatalf("adaptation.Start: %v", err)
	}
	c.runtime = r
	t.Cleanup(r.Stop)
	c.cut = harness.RuntimeProxy(t, c.path("nri-front.sock"), c.path("nri.sock"))

	c.metrics = freeAddr(t)
	args := []string{"run",
		"--nri-socket", c.path("nri-front.sock"), "--nri-plugin-index", "90",
		"--cdi-dir", c.path("cdi"), "--state-dir", c.path("state"),
		"--topology", "synthetic:" + s.topology, "--reserved-cpus", "0",
		"--metrics-addr", c.metrics, "--debug-addr", "127.0.0.1:0"}
	if dra {
		args = append(args, "--node-name", node, "--driver-name", driver, "--kubeconfig", c.startAPIServer(),
			"--kubelet-plugins-dir", c.path("plugins"), "--kubelet-registry-dir", c.path("plugins_registry"))
	} else {
		args = append(args, "--dra", "false")
	}
	c.args = append(args, s.args...)
	if s.before != nil {
		s.before(c)
	}
	c.launch()
	return c
}

// agentBinary is the agent to run: `resmgr`, the binary that ships, or with a crash point
// (crashAt, not empty) or a hold point (holdAt, not nil), the tests package's
// `resmgr-crashing`: the same agent (`resmgr_agent::main`) with the crash test's fault hook,
// which aborts the process at the point RESMGR_CRASH_AT names, or stops it at the point
// RESMGR_HOLD_AT names until the test lets it go on. The shipped binary has no such hook.
func agentBinary(t testing.TB, crashAt string, holdAt *hold) (string, []string) {
	t.Helper()
	name, env := "resmgr", []string(nil)
	switch {
	case crashAt != "" && holdAt != nil:
		t.Fatal("an agent either crashes or holds at a point, not both")
	case crashAt != "":
		name, env = "resmgr-crashing", []string{"RESMGR_CRASH_AT=" + crashAt}
	case holdAt != nil:
		name, env = "resmgr-crashing", []string{"RESMGR_HOLD_AT=" + holdAt.point + ":" + holdAt.fifo}
	}
	bin, err := rustbin.Path(name)
	if err != nil {
		t.Fatal(err)
	}
	return bin, env
}

// launch starts the agent with c.args.
func (c *cluster) launch() {
	t := c.t
	bin, crashEnv := agentBinary(t, c.crashAt, c.holdAt)
	c.agent = exec.Command(bin, c.args...)
	// Nothing of a cluster in the environment: without DRA the agent must not look for one.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_") && !strings.HasPrefix(kv, "NODE_NAME=") && !strings.HasPrefix(kv, "RESMGR_CRASH_AT=") && !strings.HasPrefix(kv, "RESMGR_HOLD_AT=") {
			c.agent.Env = append(c.agent.Env, kv)
		}
	}
	c.agent.Env = append(c.agent.Env, crashEnv...)
	c.agent.Stdout, c.agent.Stderr = c.logs, c.logs
	if err := c.agent.Start(); err != nil {
		t.Fatalf("starting resmgr run: %v", err)
	}
	agent, exited := c.agent, make(chan error, 1)
	c.exited = exited
	go func() { exited <- agent.Wait() }()
	t.Cleanup(func() {
		_ = agent.Process.Kill()
		if t.Failed() {
			t.Logf("resmgr run logs:\n%s", c.logs.String())
		}
	})
}

// startAPIServer runs the fake API server (the tests package's fake-apiserver binary) with our node and one allocated claim.
func (c *cluster) startAPIServer() string {
	objects := []map[string]any{
		{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": node, "uid": "node-uid"}},
		{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
			"metadata": map[string]any{"name": "db-cpus", "namespace": "default", "uid": claimUID},
			"spec":     map[string]any{"devices": map[string]any{"requests": []any{}}},
			"status": map[string]any{
				"allocation": map[string]any{"devices": map[string]any{"results": []any{
					map[string]any{"request": "cpus", "driver": driver, "pool": node, "device": "numa1",
						"shareID": "5a4e0000-0000-4000-8000-000000000001", "consumedCapacity": map[string]any{"cpu": "2"}},
					map[string]any{"request": "gpu", "driver": "gpu.example.com", "pool": node, "device": "gpu0"},
				}}},
				"reservedFor": []any{map[string]any{"resource": "pods", "name": "db", "uid": podDB}},
			}},
		configuredClaim(unpinnedUID, "cache-cpus", map[string]any{"memoryPinning": false}),
		configuredClaim(typoUID, "typo-cpus", map[string]any{"memoryPining": false}),
		templateClaim(),
	}
	data, err := json.Marshal(objects)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(c.path("objects.json"), data, 0o600); err != nil {
		c.t.Fatal(err)
	}
	bin, err := rustbin.Path("fake-apiserver")
	if err != nil {
		c.t.Fatal(err)
	}
	kubeconfig := c.path("kubeconfig")
	cmd := exec.Command(bin, c.path("objects.json"), kubeconfig)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	c.api = stdin
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("starting the fake API server: %v", err)
	}
	c.t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	c.answers = bufio.NewReader(stdout)
	line, err := c.answers.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		c.t.Fatalf("the fake API server did not start: %q %v", line, err)
	}
	return kubeconfig
}

// templateClaim is an allocated claim of one CPU on numa0 for the cache pod, made from a
// ResourceClaimTemplate: the controller names it after the pod and annotates the pod's name for
// it.
func templateClaim() map[string]any {
	return map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
		"metadata": map[string]any{"name": "cache-cpus-x7k2p", "namespace": "default", "uid": templateUID,
			"annotations": map[string]any{"resource.kubernetes.io/pod-claim-name": "cpus"}},
		"spec": map[string]any{"devices": map[string]any{"requests": []any{}}},
		"status": map[string]any{
			"allocation": map[string]any{"devices": map[string]any{"results": []any{
				map[string]any{"request": "cpus", "driver": driver, "pool": node, "device": "numa0",
					"shareID": "5a4e0000-0000-4000-8000-000000000004", "consumedCapacity": map[string]any{"cpu": "1"}},
			}}},
			"reservedFor": []any{map[string]any{"resource": "pods", "name": "cache", "uid": podCache}},
		}}
}

// configuredClaim is an allocated claim of two CPUs on numa0 for the cache pod whose allocation
// carries a CpuConfig for our driver with settings, as the scheduler copies it from the claim,
// next to another driver's configuration.
func configuredClaim(uid, name string, settings map[string]any) map[string]any {
	parameters := map[string]any{"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig"}
	for k, v := range settings {
		parameters[k] = v
	}
	return map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
		"metadata": map[string]any{"name": name, "namespace": "default", "uid": uid},
		"spec":     map[string]any{"devices": map[string]any{"requests": []any{}}},
		"status": map[string]any{
			"allocation": map[string]any{"devices": map[string]any{
				"results": []any{map[string]any{"request": "cpus", "driver": driver, "pool": node, "device": "numa0",
					"consumedCapacity": map[string]any{"cpu": "2"}}},
				"config": []any{
					map[string]any{"source": "FromClass", "requests": []any{},
						"opaque": map[string]any{"driver": "gpu.example.com", "parameters": map[string]any{"anything": 1}}},
					map[string]any{"source": "FromClaim", "requests": []any{"cpus"},
						"opaque": map[string]any{"driver": driver, "parameters": parameters}},
				},
			}},
			"reservedFor": []any{map[string]any{"resource": "pods", "name": "cache", "uid": podCache}},
		}}
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitFor polls a condition until it holds or the wait limit passes: the agent's sockets and
// files appear in its own time, and a file has no other signal to wait on.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		select {
		case err := <-c.exited:
			c.t.Fatalf("resmgr run exited (%v) while waiting for %s", err, what)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func exists(p string) func() bool {
	return func() bool { _, err := os.Stat(p); return err == nil }
}

// nextUpdate waits for the runtime's next unsolicited update of a container.
func (c *cluster) nextUpdate(id string) *api.ContainerUpdate {
	c.t.Helper()
	timeout := time.After(waitLimit)
	for {
		select {
		case batch := <-c.updates:
			for _, u := range batch {
				if u.ContainerId == id {
					return u
				}
			}
		case <-timeout:
			c.t.Fatalf("no update of %s reached the runtime", id)
		}
	}
}

// registerLikeTheKubelet registers the agent as the kubelet's plugin watcher does
// (kubeletplay.Register) and returns its DRA endpoint.
func (c *cluster) registerLikeTheKubelet() string {
	c.t.Helper()
	socket := c.path("plugins_registry", driver+"-reg.sock")
	c.waitFor("the registration socket", exists(socket))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := kubeletplay.Register(ctx, socket, func(info *registerapi.PluginInfo) error {
		if info.Type != "DRAPlugin" || info.Name != driver || len(info.SupportedVersions) == 0 || info.SupportedVersions[0] != "v1.DRAPlugin" {
			return fmt.Errorf("want a DRAPlugin named %s preferring v1.DRAPlugin", driver)
		}
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return info.Endpoint
}

func draClient(t *testing.T, endpoint string) drav1.DRAPluginClient {
	dra, conn, err := kubeletplay.DRAClient(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return dra
}

func get(t testing.TB, url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// ready waits until the agent is an active NRI plugin, registers it like the kubelet does, and
// waits for /readyz; it returns the DRA endpoint.
func (c *cluster) ready() string {
	for n := 0; n != 1; {
		select {
		case n = <-c.active:
		case err := <-c.exited:
			c.t.Fatalf("resmgr run exited (%v) before registering with the runtime", err)
		case <-time.After(waitLimit):
			c.t.Fatal("resmgr never became an active NRI plugin")
		}
	}
	endpoint := c.registerLikeTheKubelet()
	c.waitFor("/readyz to say ready", func() bool {
		code, _ := get(c.t, "http://"+c.metrics+"/readyz")
		return code == http.StatusOK
	})
	return endpoint
}

// inject resolves a qualified CDI device from the agent's spec directory with the runtimes' CDI
// cache and returns the environment it injects.
func (c *cluster) inject(cdiID string) []string {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(c.path("cdi")), cdi.WithAutoRefresh(false))
	if err != nil {
		c.t.Fatalf("CDI cache: %v", err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if _, err := cache.InjectDevices(spec, cdiID); err != nil {
		c.t.Fatalf("injecting %s: %v", cdiID, err)
	}
	return spec.Process.Env
}

func TestTheAgentGrantsAClaimEndToEnd(t *testing.T) {
	c := start(t)
	endpoint := c.ready()

	// The scheduler's view: one pool of our devices for this node.
	c.waitFor("our ResourceSlice", func() bool {
		_, body := get(t, kubeURL(t, c.path("kubeconfig"))+"/apis/resource.k8s.io/v1/resourceslices")
		return strings.Contains(body, `"numa1"`) && strings.Contains(body, `"nodeName":"`+node+`"`)
	})

	// The kubelet prepares the claim.
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	dra := draClient(t, endpoint)
	claim := &drav1.Claim{Namespace: "default", Name: "db-cpus", Uid: claimUID}
	resp, err := dra.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{claim}})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	got := resp.Claims[claimUID]
	if got == nil || got.Error != "" || len(got.Devices) != 1 {
		t.Fatalf("prepare answered %+v", got)
	}
	dev := got.Devices[0]
	cdiID := fmt.Sprintf("%s/device=claim-%s-0", driver, claimUID)
	if dev.PoolName != node || dev.DeviceName != "numa1" || len(dev.CdiDeviceIds) != 1 || dev.CdiDeviceIds[0] != cdiID ||
		dev.GetShareId() != "5a4e0000-0000-4000-8000-000000000001" || strings.Join(dev.RequestNames, ",") != "cpus" {
		t.Fatalf("prepared device %+v", dev)
	}

	// The runtime's CDI cache resolves it.
	env := c.inject(cdiID)
	prefix := "DRA_CPUSET_" + claimUID + "="
	claimed := ""
	for _, e := range env {
		if strings.HasPrefix(e, prefix) {
			claimed = strings.TrimPrefix(e, prefix)
		}
	}
	if claimed == "" {
		t.Fatalf("injected env %v has no %s", env, prefix)
	}

	// The web container, which shared NUMA node 1, was shrunk away from the claim's CPUs.
	web := c.nextUpdate("web-app").GetLinux().GetResources().GetCpu().GetCpus()
	if web == "" || overlaps(web, claimed) {
		t.Fatalf("web-app updated to %q; the claim holds %q", web, claimed)
	}

	// The claim's container is created: the runtime pins it to the claim's CPUs.
	created, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{
		Pod: &api.PodSandbox{Id: "sb-db", Name: "db", Uid: podDB, Namespace: "default",
			Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-poddb.slice"}},
		Container: &api.Container{Id: "db-postgres", PodSandboxId: "sb-db", Name: "postgres",
			Env: env, CDIDevices: []*api.CDIDevice{{Name: cdiID}}},
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if cpus := created.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus(); cpus != claimed {
		t.Fatalf("the claim's container was pinned to %q, want %q", cpus, claimed)
	}
	if mems := created.GetAdjust().GetLinux().GetResources().GetCpu().GetMems(); mems != "1" {
		t.Fatalf("the claim's container got memory nodes %q, want 1", mems)
	}

	// Metrics saw it all.
	_, metrics := get(t, "http://"+c.metrics+"/metrics")
	for _, want := range []string{`resmgr_claims_prepared_total 1`, `resmgr_nri_events_total{kind="create-container"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, metrics)
		}
	}

	// Unprepare: the spec goes, the web container gets its CPUs back.
	if _, err := c.runtime.StopContainer(ctx, &api.StopContainerRequest{
		Pod:       &api.PodSandbox{Id: "sb-db", Uid: podDB, Namespace: "default", Name: "db"},
		Container: &api.Container{Id: "db-postgres", PodSandboxId: "sb-db", Name: "postgres"},
	}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	un, err := dra.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: []*drav1.Claim{claim}})
	if err != nil || un.Claims[claimUID] == nil || un.Claims[claimUID].Error != "" {
		t.Fatalf("NodeUnprepareResources: %+v %v", un, err)
	}
	if exists(c.path("cdi", driver+"-device_"+claimUID+".json"))() {
		t.Fatal("the claim's CDI spec is still there after unprepare")
	}
	if grown := c.nextUpdate("web-app").GetLinux().GetResources().GetCpu().GetCpus(); !overlaps(grown, claimed) {
		t.Fatalf("web-app got %q back, not the released %q", grown, claimed)
	}

	// SIGTERM: deregistered, state saved, exit 0.
	if err := c.agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.exited:
		if err != nil {
			t.Fatalf("resmgr run exited with %v after SIGTERM", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("resmgr run did not stop after SIGTERM")
	}
	if exists(c.path("plugins_registry", driver+"-reg.sock"))() {
		t.Fatal("the registration socket outlived the agent")
	}
	if !exists(c.path("state", "state.json"))() {
		t.Fatal("no state file after SIGTERM")
	}
}

// A claim's configuration, as the API server serves it, reaches the policy: memory pinning off
// leaves DRA_MEMS_ out of the spec and the container's memory nodes to the runtime; a typo in a
// setting fails that claim alone, by name, with no spec written.
func TestClaimConfig(t *testing.T) {
	c := start(t)
	endpoint := c.ready()

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := draClient(t, endpoint).NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{
		{Namespace: "default", Name: "cache-cpus", Uid: unpinnedUID},
		{Namespace: "default", Name: "typo-cpus", Uid: typoUID},
	}})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	if typo := resp.Claims[typoUID]; typo == nil || !strings.Contains(typo.Error, "memoryPining") || len(typo.Devices) != 0 {
		t.Fatalf("the claim with a typo in its configuration was answered %+v", typo)
	}
	if exists(c.path("cdi", driver+"-device_"+typoUID+".json"))() {
		t.Fatal("the refused claim has a CDI spec")
	}
	unpinned := resp.Claims[unpinnedUID]
	if unpinned == nil || unpinned.Error != "" || len(unpinned.Devices) != 1 {
		t.Fatalf("the unpinned claim was answered %+v", unpinned)
	}

	cdiID := fmt.Sprintf("%s/device=claim-%s-0", driver, unpinnedUID)
	env := c.inject(cdiID)
	claimed := ""
	for _, e := range env {
		if strings.HasPrefix(e, "DRA_MEMS_") {
			t.Fatalf("memory pinning is off, yet the spec sets %s", e)
		}
		if v, ok := strings.CutPrefix(e, "DRA_CPUSET_"+unpinnedUID+"="); ok {
			claimed = v
		}
	}
	if claimed == "" {
		t.Fatalf("injected env %v has no DRA_CPUSET_%s", env, unpinnedUID)
	}

	created, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{
		Pod: &api.PodSandbox{Id: "sb-cache", Name: "cache", Uid: podCache, Namespace: "default",
			Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-podcache.slice"}},
		Container: &api.Container{Id: "cache-main", PodSandboxId: "sb-cache", Name: "main",
			Env: env, CDIDevices: []*api.CDIDevice{{Name: cdiID}}},
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	cpu := created.GetAdjust().GetLinux().GetResources().GetCpu()
	if cpu.GetCpus() != claimed || cpu.GetMems() != "" {
		t.Fatalf("the claim's container was given cpus %q mems %q, want cpus %q and no mems", cpu.GetCpus(), cpu.GetMems(), claimed)
	}
}

func TestLosingTheRuntimeEndsTheAgent(t *testing.T) {
	c := start(t)
	for n := 0; n != 1; {
		select {
		case n = <-c.active:
		case err := <-c.exited:
			t.Fatalf("resmgr run exited (%v) before registering with the runtime", err)
		case <-time.After(waitLimit):
			t.Fatal("resmgr never became an active NRI plugin")
		}
	}
	c.cut()
	select {
	case err := <-c.exited:
		var exit *exec.ExitError
		if err == nil || !asExitError(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("resmgr run ended with %v after losing the runtime, want a non-zero exit", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("resmgr run kept running without its runtime")
	}
}

// Without DRA (`--dra false`) the agent is an NRI plugin only, as people coming from nri-plugins
// run it first: no API server, kubeconfig, node name or kubelet; ready once synchronized with
// the runtime; a Guaranteed container gets CPUs of its own, which no shared container gets; and
// nothing is published.
func TestNRIOnlyMode(t *testing.T) {
	c := startWith(t, false)
	for n := 0; n != 1; {
		select {
		case n = <-c.active:
		case err := <-c.exited:
			t.Fatalf("resmgr run exited (%v) before registering with the runtime", err)
		case <-time.After(waitLimit):
			t.Fatal("resmgr never became an active NRI plugin")
		}
	}
	c.waitFor("/readyz to say ready without any kubelet", func() bool {
		code, _ := get(t, "http://"+c.metrics+"/readyz")
		return code == http.StatusOK
	})

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	guaranteed, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{
		Pod: &api.PodSandbox{Id: "sb-batch", Name: "batch", Uid: "pod-batch-uid", Namespace: "jobs",
			Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-podbatch.slice"}},
		Container: &api.Container{Id: "batch-worker", PodSandboxId: "sb-batch", Name: "worker",
			Linux: &api.LinuxContainer{Resources: &api.LinuxResources{
				Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 2048},
					Quota: &api.OptionalInt64{Value: 200000}, Period: &api.OptionalUInt64{Value: 100000}},
				Memory: &api.LinuxMemory{Limit: &api.OptionalInt64{Value: 1 << 30}}}}},
	})
	if err != nil {
		t.Fatalf("CreateContainer of the Guaranteed container: %v", err)
	}
	exclusive := guaranteed.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus()
	if len(cpus(exclusive)) != 2 || cpus(exclusive)[0] {
		t.Fatalf("the Guaranteed container got cpus %q, want two CPUs of its own, not the reserved CPU 0", exclusive)
	}
	for _, u := range guaranteed.GetUpdate() {
		if got := u.GetLinux().GetResources().GetCpu().GetCpus(); overlaps(got, exclusive) {
			t.Fatalf("%s was moved to %q, which overlaps the exclusive %q", u.ContainerId, got, exclusive)
		}
	}
	shared, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{
		Pod: &api.PodSandbox{Id: "sb-api", Name: "api", Uid: "pod-api-uid", Namespace: "jobs",
			Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-burstable-podapi.slice"}},
		Container: &api.Container{Id: "api-server", PodSandboxId: "sb-api", Name: "server",
			Linux: &api.LinuxContainer{Resources: &api.LinuxResources{
				Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 512}}}}},
	})
	if err != nil {
		t.Fatalf("CreateContainer of the Burstable container: %v", err)
	}
	if got := shared.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus(); got == "" || overlaps(got, exclusive) {
		t.Fatalf("the Burstable container got cpus %q; the exclusive ones are %q", got, exclusive)
	}

	_, metrics := get(t, "http://"+c.metrics+"/metrics")
	for _, want := range []string{"resmgr_ready 1", "resmgr_runtime_synchronized 1", "resmgr_devices_published 0",
		`resmgr_nri_events_total{kind="create-container"} 2`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	if !strings.Contains(c.logs.String(), "DRA is off") {
		t.Fatalf("the agent did not say it runs without DRA:\n%s", c.logs.String())
	}

	if err := c.agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.exited:
		if err != nil {
			t.Fatalf("resmgr run exited with %v after SIGTERM", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("resmgr run did not stop after SIGTERM")
	}
	if !exists(c.path("state", "state.json"))() {
		t.Fatal("no state file after SIGTERM")
	}
}
