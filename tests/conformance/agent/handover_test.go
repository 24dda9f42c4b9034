// Rolling updates hand the node over from the old agent to the new one. The new agent, started
// beside the old one with a pod UID of its own, asks the old one for the node over the state
// directory's handover socket, registers with the kubelet under sockets named after its pod, and
// holds the kubelet's calls while the old agent drains its claim calls, disconnects from the
// runtime (containerd's own NRI adaptation here) and lets the state directory go; then it takes
// the state, the runtime connection and the claims. The kubelet is never refused, no CPU is
// granted twice, and whichever agent dies in the middle (at a named crash point), the other ends
// up owning the node with every claim.
package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/resmgr/resmgr/tests/conformance/internal/harness"
	"github.com/resmgr/resmgr/tests/gokit/kubeletplay"
)

const (
	// Short pod UIDs: the sockets named after them live under the test's temporary directory,
	// and a Unix socket's path has at most 107 bytes.
	oldPod   = "0a"
	newPod   = "0b"
	thirdPod = "0c"
)

// instance is one more `resmgr run` of the cluster, with a pod UID of its own.
type instance struct {
	t       testing.TB
	pod     string
	cmd     *exec.Cmd
	exited  chan error
	logs    *harness.LockedBuffer
	metrics string
}

// spawn starts another agent on the cluster's node and state directory, as the DaemonSet's
// surge pod `pod`.
func (c *cluster) spawn(pod string) *instance {
	c.t.Helper()
	return c.spawnCrashing(pod, "")
}

// spawnCrashing is spawn of an agent that aborts at the point crashAt (none if empty): see
// agentBinary.
func (c *cluster) spawnCrashing(pod, crashAt string) *instance {
	c.t.Helper()
	return c.spawnWith(pod, crashAt)
}

// spawnWith is spawn of an agent that aborts at the point crashAt (none if empty), with more
// arguments; an argument given there replaces the cluster's.
func (c *cluster) spawnWith(pod, crashAt string, more ...string) *instance {
	c.t.Helper()
	bin, env := agentBinary(c.t, crashAt, nil)
	in := &instance{t: c.t, pod: pod, exited: make(chan error, 1), logs: &harness.LockedBuffer{}, metrics: freeAddr(c.t)}
	var args []string
	for i := 0; i < len(c.args); i++ {
		switch c.args[i] {
		case "--metrics-addr", "--pod-uid", "--pod-generation":
			i++
			continue
		}
		args = append(args, c.args[i])
	}
	args = append(args, "--metrics-addr", in.metrics, "--pod-uid", pod)
	args = append(args, more...)
	in.cmd = exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_") && !strings.HasPrefix(kv, "NODE_NAME=") && !strings.HasPrefix(kv, "RESMGR_CRASH_AT=") && !strings.HasPrefix(kv, "RESMGR_HOLD_AT=") {
			in.cmd.Env = append(in.cmd.Env, kv)
		}
	}
	in.cmd.Env = append(in.cmd.Env, env...)
	in.cmd.Stdout, in.cmd.Stderr = in.logs, in.logs
	if err := in.cmd.Start(); err != nil {
		c.t.Fatalf("starting resmgr run for pod %s: %v", pod, err)
	}
	cmd, exited := in.cmd, in.exited
	go func() { exited <- cmd.Wait() }()
	c.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if c.t.Failed() {
			c.t.Logf("resmgr run of pod %s logs:\n%s", pod, in.logs.String())
		}
	})
	return in
}

// ready reports whether the instance's /readyz says ready, and what it says.
func (in *instance) ready() (bool, string) {
	resp, err := http.Get("http://" + in.metrics + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, string(body)
}

// stop sends SIGTERM and waits for a clean exit.
func (in *instance) stop() {
	in.t.Helper()
	if err := in.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		in.t.Fatal(err)
	}
	select {
	case err := <-in.exited:
		if err != nil {
			in.t.Fatalf("resmgr run of pod %s exited with %v after SIGTERM", in.pod, err)
		}
	case <-time.After(waitLimit):
		in.t.Fatalf("resmgr run of pod %s did not stop after SIGTERM", in.pod)
	}
}

// registrationSocket is the socket the agent of `pod` registers with.
func (c *cluster) registrationSocket(pod string) string {
	return c.path("plugins_registry", driver+"-"+pod+"-reg.sock")
}

// registerInstance registers the agent of `pod` as the kubelet does (GetInfo, then
// NotifyRegistrationStatus), and returns its DRA endpoint, which must be its own.
func (c *cluster) registerInstance(pod string) string {
	c.t.Helper()
	socket := c.registrationSocket(pod)
	// Not c.waitFor: the cluster's first agent may die meanwhile, on purpose.
	for deadline := time.Now().Add(waitLimit); !exists(socket)(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for the registration socket of %s", pod)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := kubeletplay.Register(ctx, socket, func(info *registerapi.PluginInfo) error {
		if info.Name != driver || !strings.HasSuffix(info.Endpoint, "dra-"+pod+".sock") {
			return fmt.Errorf("the agent of %s must register a DRA socket of its own", pod)
		}
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return info.Endpoint
}

// ownedByTheOldAgent starts the cluster with the agent of oldPod, registered, ready, and claim
// db-cpus prepared on it; returns the claim's CPUs.
func ownedByTheOldAgent(t *testing.T) (*cluster, string) {
	return ownedByTheOldAgentHolding(t, nil)
}

// ownedByTheOldAgentHolding is ownedByTheOldAgent with the old agent stopping at holdAt (none if
// nil).
func ownedByTheOldAgentHolding(t *testing.T, holdAt *hold) (*cluster, string) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", args: []string{"--pod-uid", oldPod}, holdAt: holdAt})
	for n := 0; n != 1; {
		select {
		case n = <-c.active:
		case err := <-c.exited:
			t.Fatalf("resmgr run exited (%v) before registering with the runtime", err)
		case <-time.After(waitLimit):
			t.Fatal("resmgr never became an active NRI plugin")
		}
	}
	dra := draClient(t, c.registerInstance(oldPod))
	if got := c.prepare(t, dra, "db-cpus", claimUID); got.GetError() != "" {
		t.Fatalf("the old agent refused db-cpus: %s", got.GetError())
	}
	return c, c.claimedCPUs(claimUID)
}

// createBestEffortNow creates a container through the runtime and returns the CPUs it was
// created on (the agent's adjustment).
func (c *cluster) createBestEffortNow(name string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	pod, ctr := bestEffort(name)
	resp, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		c.t.Fatalf("CreateContainer of %s: %v", name, err)
	}
	return resp.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus()
}

// The upgrade: the new agent takes the node over while the kubelet calls it; the kubelet is
// never refused.
func TestUpgradeHandsOver(t *testing.T) {
	c, db := ownedByTheOldAgent(t)
	oldState, err := os.ReadFile(c.path("state", "state.json"))
	if err != nil {
		t.Fatal(err)
	}

	next := c.spawn(newPod)
	dra := draClient(t, c.registerInstance(newPod))
	// The kubelet calls the newest agent it is connected to: the new one, which does not own
	// the node yet. The call is held until it does, then served.
	cache := c.prepare(t, dra, "cache-cpus", unpinnedUID)
	if cache.GetError() != "" {
		t.Fatalf("the new agent refused a claim during the handover: %s", cache.GetError())
	}
	cacheCPUs := c.claimedCPUs(unpinnedUID)
	if overlaps(cacheCPUs, db) {
		t.Fatalf("cache-cpus got %q, which db-cpus (prepared by the old agent) holds: %q", cacheCPUs, db)
	}
	// The new agent has the old one's claims: a re-prepare answers what the old one granted.
	if again := c.prepare(t, dra, "db-cpus", claimUID); again.GetError() != "" || c.claimedCPUs(claimUID) != db {
		t.Fatalf("re-prepared on the new agent: %+v, cpus %q; the old agent granted %q", again, c.claimedCPUs(claimUID), db)
	}

	// The old agent deregistered, is not ready, and stays until it is deleted.
	c.waitFor("the old agent's registration socket to go", func() bool { return !exists(c.registrationSocket(oldPod))() })
	if ok, why := c.oldInstance().ready(); ok || !strings.Contains(why, "handed the node over to the agent of pod "+newPod) {
		t.Fatalf("the old agent's /readyz says %v: %q", ok, why)
	}
	c.waitFor("the new agent to be ready", func() bool { ok, _ := next.ready(); return ok })

	// The runtime's containers are the new agent's to place now.
	if cpus := c.createBestEffortNow("after"); cpus == "" || overlaps(cpus, db) || overlaps(cpus, cacheCPUs) {
		t.Fatalf("a container created after the handover got %q; the claims hold %q and %q", cpus, db, cacheCPUs)
	}

	// The old agent writes nothing any more, and exits 0 when its pod is deleted.
	c.oldInstance().stop()
	if now, _ := os.ReadFile(c.path("state", "state.json")); string(now) == string(oldState) {
		t.Fatal("the state file is still the old agent's: the new agent saved nothing")
	}
	saved, _ := os.ReadFile(c.path("state", "state.json"))
	for _, uid := range []string{claimUID, unpinnedUID} {
		if !strings.Contains(string(saved), uid) {
			t.Fatalf("the state after the old agent's exit lacks claim %s:\n%s", uid, saved)
		}
	}
	if ok, _ := next.ready(); !ok {
		t.Fatal("the new agent is not ready once the old one exited")
	}
	next.stop()
}

// oldInstance is the cluster's first agent as an instance.
func (c *cluster) oldInstance() *instance {
	return &instance{t: c.t, pod: oldPod, cmd: c.agent, exited: c.exited, logs: c.logs, metrics: c.metrics}
}

// The old agent dies mid-handover, at each step of its side: the new agent finds the state
// directory free when it does, starts from what is on disk, and serves every claim; the claim the
// kubelet sent it meanwhile is served, not refused.
func TestOldAgentDies(t *testing.T) {
	for _, point := range []string{"handover.accepted", "handover.drained", "handover.runtime-closed", "handover.saved"} {
		t.Run(strings.TrimPrefix(point, "handover."), func(t *testing.T) {
			c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", args: []string{"--pod-uid", oldPod},
				crashAt: point})
			c.waitFor("the old agent's registration socket", exists(c.registrationSocket(oldPod)))
			oldDRA := draClient(t, c.registerInstance(oldPod))
			if got := c.prepare(t, oldDRA, "db-cpus", claimUID); got.GetError() != "" {
				t.Fatalf("the old agent refused db-cpus: %s", got.GetError())
			}
			db := c.claimedCPUs(claimUID)

			next := c.spawn(newPod)
			dra := draClient(t, c.registerInstance(newPod))
			// Held while the old agent dies at the point, as a crash, then served.
			if got := c.prepare(t, dra, "cache-cpus", unpinnedUID); got.GetError() != "" {
				t.Fatalf("the new agent refused a claim after the old one died at %s: %s", point, got.GetError())
			}
			select {
			case err := <-c.exited:
				if err == nil {
					t.Fatalf("the old agent exited cleanly instead of dying at %s", point)
				}
			case <-time.After(waitLimit):
				t.Fatalf("the old agent did not reach %s", point)
			}
			if cache := c.claimedCPUs(unpinnedUID); overlaps(cache, db) {
				t.Fatalf("cache-cpus %q overlaps db-cpus %q after the old agent died at %s", cache, db, point)
			}
			if again := c.prepare(t, dra, "db-cpus", claimUID); again.GetError() != "" || c.claimedCPUs(claimUID) != db {
				t.Fatalf("db-cpus after the old agent died at %s: %+v, cpus %q, was %q", point, again, c.claimedCPUs(claimUID), db)
			}
			c.waitFor("the new agent to be ready", func() bool { ok, _ := next.ready(); return ok })
			next.stop()
		})
	}
}

// The new agent dies mid-handover, before it tells the old one to go: the old agent keeps the node and stays
// ready; the next new agent (the DaemonSet's restart of the pod) takes it over.
func TestNewAgentDiesBeforeGo(t *testing.T) {
	c, db := ownedByTheOldAgent(t)
	doomed := c.spawnCrashing(newPod, "takeover.go")
	// The kubelet registers it and connects to it, which is when it would say go.
	conn, err := net.Dial("unix", c.registerInstance(newPod))
	if err != nil {
		t.Fatalf("connecting to the new agent's DRA socket: %v", err)
	}
	defer conn.Close()
	select {
	case <-doomed.exited:
	case <-time.After(waitLimit):
		t.Fatal("the new agent did not reach takeover.go")
	}
	if ok, why := c.oldInstance().ready(); !ok {
		t.Fatalf("the old agent is not ready after the new one died before go: %q", why)
	}
	oldDRA := draClient(t, c.registerInstance(oldPod))
	if got := c.prepare(t, oldDRA, "cache-cpus", unpinnedUID); got.GetError() != "" {
		t.Fatalf("the old agent refused a claim after the new one died: %s", got.GetError())
	}
	// The restarted new agent (same pod) takes the node over.
	next := c.spawn(newPod)
	dra := draClient(t, c.registerInstance(newPod))
	if again := c.prepare(t, dra, "db-cpus", claimUID); again.GetError() != "" || c.claimedCPUs(claimUID) != db {
		t.Fatalf("db-cpus on the restarted new agent: %+v", again)
	}
	c.waitFor("the new agent to be ready", func() bool { ok, _ := next.ready(); return ok })
}

// Two new agents at once: one takes the node over, then the other takes it from that one; at no
// time are two agents connected to the runtime, and every claim survives.
func TestTwoNewAgents(t *testing.T) {
	c, db := ownedByTheOldAgent(t)
	second, third := c.spawn(newPod), c.spawn(thirdPod)
	// Both register when the owner they asked accepts them.
	done := make(chan string, 2)
	for _, pod := range []string{newPod, thirdPod} {
		go func(pod string) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
			defer cancel()
			for ctx.Err() == nil {
				if exists(c.registrationSocket(pod))() {
					done <- pod
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			done <- ""
		}(pod)
	}
	first := <-done
	if first == "" {
		t.Fatal("neither new agent registered")
	}
	dra := draClient(t, c.registerInstance(first))
	if got := c.prepare(t, dra, "cache-cpus", unpinnedUID); got.GetError() != "" {
		t.Fatalf("the first new agent refused a claim: %s", got.GetError())
	}
	later := <-done
	if later == "" {
		t.Fatal("the second new agent never asked the first for the node")
	}
	dra = draClient(t, c.registerInstance(later))
	if again := c.prepare(t, dra, "db-cpus", claimUID); again.GetError() != "" || c.claimedCPUs(claimUID) != db {
		t.Fatalf("db-cpus on the last owner: %+v", again)
	}
	if cache := c.claimedCPUs(unpinnedUID); overlaps(cache, db) {
		t.Fatalf("cache-cpus %q overlaps db-cpus %q", cache, db)
	}
	owner, other := second, third
	if later == thirdPod {
		owner, other = third, second
	}
	c.waitFor("the last new agent to be ready", func() bool { ok, _ := owner.ready(); return ok })
	if ok, why := other.ready(); ok || !strings.Contains(why, "handed the node over") {
		t.Fatalf("the agent that took the node first says %v: %q", ok, why)
	}
	// The adaptation never had two of us: every plugin count it reported was 0 or 1.
	for {
		select {
		case n := <-c.active:
			if n > 1 {
				t.Fatalf("the runtime had %d plugins of ours at once", n)
			}
			continue
		default:
		}
		break
	}
}

// plainLogs is an agent's text logs without their colours.
func plainLogs(logs string) string {
	return ansiEscape.ReplaceAllString(logs, "")
}

var ansiEscape = regexp.MustCompile("\x1b\\[[0-9;]*m")

// hold is a point at which an agent stops until the test lets it go on (RESMGR_HOLD_AT, see
// agentBinary): there the agent says so on stderr and opens the named pipe fifo for reading,
// which blocks until the test opens it for writing.
type hold struct {
	point, fifo string
}

func newHold(t testing.TB, point string) *hold {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "hold")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatalf("making the hold pipe: %v", err)
	}
	return &hold{point: point, fifo: fifo}
}

// reached reports whether the agent whose logs these are has stopped at the point.
func (h *hold) reached(logs *harness.LockedBuffer) func() bool {
	return func() bool { return strings.Contains(logs.String(), "hold point "+h.point+": waiting") }
}

// release lets the agent stopped at the point go on.
func (h *hold) release(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(h.fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("opening the hold pipe: %v", err)
	}
	_ = f.Close()
}

// A third agent that looks at the node in the instant the owner has let it go to the successor
// it accepted, and before that successor holds it, finds it held and waits: the node passes
// to the chosen successor, which serves the kubelet's call it held, and to no one else. (The
// owner used to unlock the state directory for the successor to lock it; whoever polled the
// lock first won, and the successor, the agent the kubelet calls, timed out.)
func TestThirdAgentMidHandover(t *testing.T) {
	released := newHold(t, "handover.released")
	c, db := ownedByTheOldAgentHolding(t, released)
	next := c.spawn(newPod)
	dra := draClient(t, c.registerInstance(newPod))
	// The kubelet calls the new agent, which holds the call until it owns the node.
	type answer struct {
		resp *drav1.NodePrepareResourcesResponse
		err  error
	}
	held := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		resp, err := dra.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{
			Claims: []*drav1.Claim{{Namespace: "default", Name: "cache-cpus", Uid: unpinnedUID}}})
		held <- answer{resp, err}
	}()
	c.waitFor("the old agent to stop where it lets the node go", released.reached(c.logs))

	third := c.spawn(thirdPod)
	owns, waits := "this agent owns the node", "cannot be asked for it now"
	c.waitFor("the third agent to look at the node", func() bool {
		logs := third.logs.String()
		return strings.Contains(logs, owns) || strings.Contains(logs, waits)
	})
	if strings.Contains(third.logs.String(), owns) {
		t.Fatalf("the third agent took the node while the owner was handing it to the agent of %s", newPod)
	}
	released.release(t)

	select {
	case a := <-held:
		if a.err != nil {
			t.Fatalf("the kubelet's call to the chosen successor failed: %v", a.err)
		}
		if got := a.resp.Claims[unpinnedUID]; got.GetError() != "" {
			t.Fatalf("the chosen successor refused cache-cpus: %s", got.GetError())
		}
	case <-time.After(waitLimit):
		t.Fatal("the chosen successor never answered the kubelet's call it held")
	}
	if cache := c.claimedCPUs(unpinnedUID); overlaps(cache, db) {
		t.Fatalf("cache-cpus %q overlaps db-cpus %q", cache, db)
	}
	if !strings.Contains(next.logs.String(), owns) {
		t.Fatalf("the chosen successor served the call without owning the node")
	}
	// The third agent asks the node's new owner for it, as a new agent does; it never took it.
	c.waitFor("the third agent to ask the successor", func() bool {
		return strings.Contains(third.logs.String(), "hands it over to this one")
	})
	if logs := plainLogs(third.logs.String()); !strings.Contains(logs, "hands it over to this one owner="+newPod) {
		t.Fatalf("the third agent took the node from someone other than the successor:\n%s", logs)
	}
	for {
		select {
		case n := <-c.active:
			if n > 1 {
				t.Fatalf("the runtime had %d plugins of ours at once", n)
			}
			continue
		default:
		}
		break
	}
}

// A restarted container of a pod that the rolling update replaces (a pod of an older template
// generation of the DaemonSet) asks the new pod's agent for the node, and is refused: it
// would take the node back from the new pod, which would never be ready again, and the
// rollout would stall. An agent of the same generation (the pod deleted and made again) is
// handed the node.
func TestOlderGenerationRefused(t *testing.T) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2",
		args: []string{"--pod-uid", oldPod, "--pod-generation", "2"}})
	c.registerInstance(oldPod)
	c.waitFor("the owner to be ready", func() bool { ok, _ := c.oldInstance().ready(); return ok })
	older := c.spawnWith(newPod, "", "--pod-generation", "1")
	c.waitFor("the older pod's agent to be refused", func() bool {
		ok, why := older.ready()
		return !ok && strings.Contains(why, "generation 1, older than this agent's 2")
	})
	if exists(c.registrationSocket(newPod))() {
		t.Fatal("the refused agent registered with the kubelet: the kubelet would call it")
	}
	if ok, why := c.oldInstance().ready(); !ok {
		t.Fatalf("the owner is not ready after refusing an older agent: %q", why)
	}
	older.stop()

	same := c.spawnWith(thirdPod, "", "--pod-generation", "2")
	dra := draClient(t, c.registerInstance(thirdPod))
	if got := c.prepare(t, dra, "cache-cpus", unpinnedUID); got.GetError() != "" {
		t.Fatalf("the agent of the same generation did not take the node: %s", got.GetError())
	}
	c.waitFor("the agent of the same generation to be ready", func() bool { ok, _ := same.ready(); return ok })
}
