// Conformance of the Rust NRI stub (crates/nri, driven through its `scripted` and `logger`
// examples) with containerd's runtime side. Every test here runs against both adaptation versions.
package nri

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

func TestRegistrationAndConfigureWithSubscriptionMask(t *testing.T) {
	rt := newFakeRuntime(t, nil, nil)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--name", "conformance", "--index", "42",
		"--events", "CREATE_CONTAINER,STOP_CONTAINER")
	if line := p.expect("configured "); !strings.HasPrefix(line, "configured fake-runtime ") {
		t.Fatalf("configure line %q does not name the fake runtime", line)
	}
	rt.waitSynchronized()
	p.expect("synchronized")
	ctx := testContext(t)

	// Subscribed: CreateContainer. Not subscribed: StartContainer. Subscribed: StopContainer.
	// Calls are sequential, so if the plugin had been sent StartContainer its line would come
	// before STOP_CONTAINER's.
	if _, err := rt.createContainer(ctx, pod("p0"), container("p0", "c0")); err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if got := p.next(); got != "event CREATE_CONTAINER dedicated c0" {
		t.Fatalf("got %q, want the CreateContainer event", got)
	}
	if err := startContainer(ctx, rt.r, pod("p0"), container("p0", "c0")); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	if _, err := rt.r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod("p0"), Container: container("p0", "c0")}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if got := p.next(); got != "event STOP_CONTAINER dedicated c0" {
		t.Fatalf("got %q, want StopContainer (StartContainer is not subscribed)", got)
	}
}

func TestSynchronizeWithExistingPodsAndContainersReturnsUpdates(t *testing.T) {
	pods := []*api.PodSandbox{pod("p0"), pod("p1")}
	ctrs := []*api.Container{container("p0", "c0"), container("p0", "c1"), container("p1", "c2")}
	rt := newFakeRuntime(t, pods, ctrs)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--sync-update", "c1=2-3", "--sync-update", "c2=4")
	res := rt.waitSynchronized()
	if res.err != nil {
		t.Fatalf("synchronize failed: %v", res.err)
	}
	if got := p.expect("sync "); got != "sync pods=2 containers=3" {
		t.Fatalf("plugin saw %q", got)
	}
	p.expect("synchronized")
	if len(res.updates) != 2 || res.updates[0].ContainerId != "c1" || cpusOf(res.updates[0]) != "2-3" ||
		res.updates[1].ContainerId != "c2" || cpusOf(res.updates[1]) != "4" {
		t.Fatalf("sync updates = %v, want c1:2-3 and c2:4", res.updates)
	}
}

// Over 4 MiB of existing containers: the runtime's client refuses the single message and resends
// in chunks; the stub must answer each `more` chunk with an empty update and hand the plugin all
// of them at the end.
//
// There are several pods on purpose: the upstream chunking scales the pod count per chunk by the
// size ratio and truncates, so a single pod becomes 0 pods per chunk and the runtime keeps sending
// empty chunks (`more` stays true while the pod is unsent) until the request timeout. That is an
// upstream bug, not ours, and a real node always has more than one pod when it has 4 MiB of them.
func TestChunkedSynchronize(t *testing.T) {
	const nPods, nCtrs = 8, 600
	filler := strings.Repeat("x", 8<<10)
	var pods []*api.PodSandbox
	for i := 0; i < nPods; i++ {
		pods = append(pods, pod(fmt.Sprintf("p%d", i)))
	}
	var ctrs []*api.Container
	for i := 0; i < nCtrs; i++ {
		c := container(fmt.Sprintf("p%d", i%nPods), fmt.Sprintf("c%03d", i))
		c.Annotations = map[string]string{"filler": filler}
		ctrs = append(ctrs, c)
	}
	rt := newFakeRuntime(t, pods, ctrs)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--sync-update", "c599=7")
	res := rt.waitSynchronized()
	if res.err != nil {
		t.Fatalf("chunked synchronize failed: %v", res.err)
	}
	if got, want := p.expect("sync "), fmt.Sprintf("sync pods=%d containers=%d", nPods, nCtrs); got != want {
		t.Fatalf("plugin saw %q, want %q", got, want)
	}
	if len(res.updates) != 1 || res.updates[0].ContainerId != "c599" || cpusOf(res.updates[0]) != "7" {
		t.Fatalf("sync updates = %v, want c599:7", res.updates)
	}
	p.expect("synchronized")
}

func TestCreateContainerCpusetAdjustmentReachesTheRuntime(t *testing.T) {
	rt := newFakeRuntime(t, nil, nil)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--cpuset", "4-7")
	rt.waitSynchronized()
	reply, err := rt.createContainer(testContext(t), pod("p0"), container("p0", "c0"))
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	p.expect("event CREATE_CONTAINER")
	if got := reply.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus(); got != "4-7" {
		t.Fatalf("adjusted cpuset %q, want 4-7", got)
	}
}

// 100 KB through both directions of the real Go mux, whose 4096-byte reader drops a plugin that
// sends a larger first frame.
func TestLargeMessagesBothWays(t *testing.T) {
	rt := newFakeRuntime(t, nil, nil)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--echo-annotations")
	rt.waitSynchronized()
	big := strings.Repeat("0123456789", 10_000)
	c := container("p0", "big")
	c.Annotations = map[string]string{"payload": big}
	reply, err := rt.createContainer(testContext(t), pod("p0"), c)
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	p.expect("event CREATE_CONTAINER dedicated big")
	if got := reply.GetAdjust().GetAnnotations()["payload"]; got != big {
		t.Fatalf("echoed annotation has %d bytes, want %d", len(got), len(big))
	}
	// The plugin is still connected: a second call reaches it.
	if _, err := rt.createContainer(testContext(t), pod("p0"), container("p0", "after")); err != nil {
		t.Fatalf("CreateContainer after the large one: %v", err)
	}
	p.expect("event CREATE_CONTAINER dedicated after")
}

func TestUnsolicitedUpdateContainers(t *testing.T) {
	rt := newFakeRuntime(t, nil, nil)
	p := startPlugin(t, "scripted", "--socket", rt.socket)
	rt.waitSynchronized()
	p.expect("synchronized")

	p.send("update c0 1-2")
	got := <-rt.updates
	if len(got) != 1 || got[0].ContainerId != "c0" || cpusOf(got[0]) != "1-2" {
		t.Fatalf("runtime received %v, want c0:1-2", got)
	}
	if line := p.expect("update-"); line != "update-ok failed=" {
		t.Fatalf("plugin reported %q", line)
	}

	// A failure the plugin marked ignore_failure comes back in `failed` with no error.
	rt.setUpdateReply(func(req []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
		return req, nil
	})
	p.send("update c1 3 ignore-failure")
	<-rt.updates
	if line := p.expect("update-"); line != "update-ok failed=c1" {
		t.Fatalf("plugin reported %q", line)
	}

	// A real failure: the runtime returns an error and the failed list is lost with it.
	rt.setUpdateReply(func(req []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
		return req, errors.New("NRI update of some containers failed")
	})
	p.send("update c2 5")
	<-rt.updates
	if line := p.expect("update-"); !strings.HasPrefix(line, "update-error ") ||
		!strings.Contains(line, "NRI update of some containers failed") {
		t.Fatalf("plugin reported %q, want the runtime's failure", line)
	}
}

// The deadlock guard: an update tried from inside a handler fails at once instead of waiting for
// the runtime lock the handler's own caller holds.
func TestUpdateFromInsideAHandlerIsRefused(t *testing.T) {
	rt := newFakeRuntime(t, nil, nil)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--update-in-create")
	rt.waitSynchronized()
	p.expect("synchronized")
	if _, err := rt.createContainer(testContext(t), pod("p0"), container("p0", "c0")); err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if line := p.expect("update-"); !strings.HasPrefix(line, "update-refused ") {
		t.Fatalf("plugin reported %q, want a refusal", line)
	}
	p.expect("event CREATE_CONTAINER dedicated c0")
	select {
	case u := <-rt.updates:
		t.Fatalf("the runtime received an update from inside a handler: %v", u)
	default:
	}
}

func TestStopAndRemoveContainerEvents(t *testing.T) {
	rt := newFakeRuntime(t, nil, nil)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--events", "STOP_CONTAINER,REMOVE_CONTAINER")
	rt.waitSynchronized()
	p.expect("synchronized")
	ctx := testContext(t)
	if _, err := rt.r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod("p0"), Container: container("p0", "c0")}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if got := p.next(); got != "event STOP_CONTAINER dedicated c0" {
		t.Fatalf("got %q", got)
	}
	if err := removeContainer(ctx, rt.r, pod("p0"), container("p0", "c0")); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	if got, want := p.next(), "event REMOVE_CONTAINER "+stateEventDelivery+" c0"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// A plugin that stops answering is dropped once the request timeout passes, the event proceeds
// without it, and the plugin sees its connection close.
func TestUnresponsivePluginIsDropped(t *testing.T) {
	adaptation.SetPluginRequestTimeout(300 * time.Millisecond)
	t.Cleanup(func() { adaptation.SetPluginRequestTimeout(adaptation.DefaultPluginRequestTimeout) })
	rt := newFakeRuntime(t, nil, nil)
	p := startPlugin(t, "scripted", "--socket", rt.socket, "--hang-create", "--cpuset", "0")
	rt.waitSynchronized()
	p.expect("synchronized")
	ctx := testContext(t)
	// The first call hits the deadline; depending on the version it fails or proceeds without
	// the plugin. Either way the plugin is closed.
	_, _ = rt.createContainer(ctx, pod("p0"), container("p0", "c0"))
	p.expect("closed ")
	reply, err := rt.createContainer(ctx, pod("p0"), container("p0", "c1"))
	if err != nil {
		t.Fatalf("CreateContainer after the plugin was dropped: %v", err)
	}
	if cpus := reply.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus(); cpus != "" {
		t.Fatalf("a dropped plugin still adjusted the container (cpus %q)", cpus)
	}
	if err := p.waitExit(); err != nil {
		t.Fatalf("plugin exit: %v", err)
	}
}

func TestPluginSeesConnectionLoss(t *testing.T) {
	rt := newFakeRuntime(t, nil, nil)
	socket, cut := rt.proxy()
	p := startPlugin(t, "scripted", "--socket", socket)
	rt.waitSynchronized()
	p.expect("synchronized")
	cut()
	if line := p.expect("closed "); line != "closed the runtime closed the connection" {
		t.Fatalf("plugin reported %q", line)
	}
	if err := p.waitExit(); err != nil {
		t.Fatalf("plugin exit: %v", err)
	}
}

// The logger example registers, logs events, and exits when the runtime goes away.
func TestLoggerExample(t *testing.T) {
	rt := newFakeRuntime(t, []*api.PodSandbox{pod("p0")}, []*api.Container{container("p0", "existing")})
	socket, cut := rt.proxy()
	p := startPlugin(t, "logger", "--socket", socket, "--index", "05")
	if res := rt.waitSynchronized(); res.err != nil {
		t.Fatalf("synchronize: %v", res.err)
	}
	if _, err := rt.createContainer(testContext(t), pod("p0"), container("p0", "logged")); err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	cut()
	if err := p.waitExit(); err != nil {
		t.Fatalf("logger exit: %v", err)
	}
	log := p.stderr.String()
	for _, want := range []string{"Synchronize", "existing", "CreateContainer", "ctr-logged(logged)", "connection closed"} {
		if !strings.Contains(log, want) {
			t.Fatalf("logger output lacks %q:\n%s", want, log)
		}
	}
}
