// A runtime with CRI-O 1.36's NRI lock order. CRI-O 1.36 is built with NRI v0.11, whose
// adaptation serves a plugin's UpdateContainers under its own lock and then takes CRI-O's NRI
// lock, while every CRI-O event takes CRI-O's lock first and the adaptation's after it (fixed in
// NRI v0.12: containerd/nri#301). When CRI-O removes a container that exited by itself it sends
// the plugins StopContainer, applies the updates of their replies (one `runc update` each) still
// holding its lock, then sends RemoveContainer: an UpdateContainers arriving in between takes the
// adaptation's lock and waits for CRI-O's, which waits for the adaptation's. The runtime then
// hangs for good, as the CRI-O e2e did when a claim was released while a container was being
// stopped. The agent must leave such windows alone: its updates wait for a lull in the runtime's
// calls, and never go while the runtime has not answered the one before (nri::UpdateLull).
//
// The adaptation here is NRI v0.12's, so the v0.11 order is played by two locks of the fake
// runtime around it: the events take `crio` then `adaptation`, and UpdateContainers takes
// `adaptation` then `crio`.
package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

const (
	// runcUpdate is how long the runtime takes to apply one update of a reply: a `runc update`
	// on a busy node. The agent's lull must outlast it.
	runcUpdate = 40 * time.Millisecond
	// deadlockLimit is how long a lock the runtime needs may stay taken before the test calls it
	// a deadlock: every holder here lets go well within it (the slow update after 3 s).
	deadlockLimit = 5 * time.Second
)

// lock is a mutex whose acquisition can give up.
type lock chan struct{}

func (l lock) within(d time.Duration) bool {
	select {
	case l <- struct{}{}:
		return true
	case <-time.After(d):
		return false
	}
}

func (l lock) unlock() { <-l }

// v011Locks are CRI-O's NRI lock and the v0.11 adaptation's.
type v011Locks struct {
	crio, adaptation lock
	// arrived counts the UpdateContainers calls that reached the runtime.
	arrived chan struct{}
	mu      sync.Mutex
	// slow, when set, is what the next UpdateContainers waits for, holding both locks, as CRI-O
	// waits for a `runc update` of a container being killed.
	slow chan struct{}
}

// slowNext makes the next UpdateContainers wait for `until` once it holds both locks.
func (l *v011Locks) slowNext(until chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slow = until
}

func newV011Locks() *v011Locks {
	return &v011Locks{crio: make(lock, 1), adaptation: make(lock, 1), arrived: make(chan struct{}, 64)}
}

// aroundUpdate takes the locks in the order the v0.11 adaptation and CRI-O take them for a
// plugin's UpdateContainers; the returned function releases them.
func (l *v011Locks) aroundUpdate() (func(), error) {
	l.arrived <- struct{}{}
	if !l.adaptation.within(deadlockLimit) {
		return nil, fmt.Errorf("the adaptation's lock stayed taken for %v", deadlockLimit)
	}
	// Longer than the events wait for the adaptation's lock, so that the test names the deadlock
	// before this side gives up on it.
	if !l.crio.within(2 * deadlockLimit) {
		l.adaptation.unlock()
		return nil, fmt.Errorf("deadlock: UpdateContainers holds the adaptation's lock and waited %v for CRI-O's", 2*deadlockLimit)
	}
	l.mu.Lock()
	slow := l.slow
	l.slow = nil
	l.mu.Unlock()
	if slow != nil {
		<-slow
	}
	return func() { l.crio.unlock(); l.adaptation.unlock() }, nil
}

// An update the agent makes while the runtime removes a container that exited by itself does not
// reach the runtime between the StopContainer and the RemoveContainer of that removal.
func TestUpdatesWaitOutARemovalOnNRIv011(t *testing.T) {
	// Guaranteed containers get CPUs of their own outside the claims' partition, NUMA node 1,
	// which is lent to shared containers while unclaimed; an API server shares NUMA node 0.
	apiPod := &api.PodSandbox{Id: "sb-api", Name: "api", Uid: "pod-api-uid", Namespace: "jobs",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-burstable-podapi.slice"}}
	apiServer := &api.Container{Id: "api-server", PodSandboxId: "sb-api", Name: "server",
		State: api.ContainerState_CONTAINER_RUNNING,
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{
			Shares: &api.OptionalUInt64{Value: 512}, Cpus: "1-7", Mems: "0"}}}}
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", v011Locks: true,
		running: []*api.PodSandbox{apiPod}, containers: []*api.Container{apiServer},
		args: []string{"--cpu-exclusivity=partition", "--claim-cpus=8-15"}})
	endpoint := c.ready()
	locks := c.locks
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	dra := draClient(t, endpoint)

	// A Guaranteed container, created as CRI-O creates one: under its lock.
	pod := &api.PodSandbox{Id: "sb-batch", Name: "batch", Uid: "pod-batch-uid", Namespace: "jobs",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-podbatch.slice"}}
	worker := &api.Container{Id: "batch-worker", PodSandboxId: "sb-batch", Name: "worker",
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{
			Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 2048},
				Quota: &api.OptionalInt64{Value: 400000}, Period: &api.OptionalUInt64{Value: 100000}},
			Memory: &api.LinuxMemory{Limit: &api.OptionalInt64{Value: 1 << 30}}}}}
	locks.crio <- struct{}{}
	locks.adaptation <- struct{}{}
	created, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: worker})
	locks.adaptation.unlock()
	locks.crio.unlock()
	if err != nil {
		t.Fatalf("CreateContainer of the Guaranteed container: %v", err)
	}
	c.applyReply(created.GetUpdate())
	c.postStart(ctx, pod, worker)

	// It exits by itself; the kubelet removes it. CRI-O sends StopContainer first, as no stop
	// reached the plugins, and applies the reply's updates.
	locks.crio <- struct{}{}
	removing := true
	defer func() {
		if removing {
			locks.crio.unlock()
		}
	}()
	locks.adaptation <- struct{}{}
	stopped, err := c.runtime.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: worker})
	locks.adaptation.unlock()
	if err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if len(stopped.GetUpdate()) == 0 {
		t.Fatal("the StopContainer reply carries no update: the runtime would have nothing to apply")
	}

	// Meanwhile the kubelet prepares a claim, whose CPUs the web container shares: the agent
	// must update it.
	type answer struct {
		resp *drav1.NodePrepareResourcesResponse
		err  error
	}
	prepared := make(chan answer, 1)
	go func() {
		claim := &drav1.Claim{Namespace: "default", Name: "db-cpus", Uid: claimUID}
		resp, err := dra.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{claim}})
		prepared <- answer{resp, err}
	}()

	// Applying the reply takes the runtime a `runc update` per update; then it removes.
	time.Sleep(time.Duration(len(stopped.GetUpdate())) * runcUpdate)
	c.applyReply(stopped.GetUpdate())
	if !locks.adaptation.within(deadlockLimit) {
		t.Fatalf("the runtime deadlocked: the agent's UpdateContainers took the adaptation's lock "+
			"between the StopContainer and the RemoveContainer of a removal (CRI-O holds its own lock "+
			"throughout); logs:\n%s", c.logs.String())
	}
	err = c.runtime.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: worker})
	locks.adaptation.unlock()
	if err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	removing = false
	locks.crio.unlock()

	got := <-prepared
	if got.err != nil || got.resp.Claims[claimUID] == nil || got.resp.Claims[claimUID].Error != "" {
		t.Fatalf("NodePrepareResources: %+v %v", got.resp, got.err)
	}
	claimed := ""
	prefix := "DRA_CPUSET_" + claimUID + "="
	for _, e := range c.inject(fmt.Sprintf("%s/device=claim-%s-0", driver, claimUID)) {
		if strings.HasPrefix(e, prefix) {
			claimed = strings.TrimPrefix(e, prefix)
		}
	}
	web := c.nextUpdate("web-app").GetLinux().GetResources().GetCpu().GetCpus()
	if claimed == "" || web == "" || overlaps(web, claimed) {
		t.Fatalf("web-app was updated to %q; the claim holds %q", web, claimed)
	}
}

// An update the runtime is slow to apply holds both locks; an event waits for CRI-O's meanwhile.
// A second update sent then queues for the adaptation's lock ahead of that event, and once the
// first lets go it takes the adaptation's lock while the event takes CRI-O's: a deadlock, the one
// the CRI-O cluster stage met (docs/deploy.md#cri-o-under-the-kubelet). The agent must not send
// another update while the runtime has not answered the one before.
func TestOneUpdateAtATimeOnNRIv011(t *testing.T) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", v011Locks: true})
	endpoint := c.ready()
	locks := c.locks
	slow := make(chan struct{})
	locks.slowNext(slow)
	released := false
	defer func() {
		if !released {
			close(slow)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	// A claim moves the web container: the runtime is slow to apply that update.
	go func() {
		claim := &drav1.Claim{Namespace: "default", Name: "db-cpus", Uid: claimUID}
		_, _ = draClient(t, endpoint).NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{claim}})
	}()
	select {
	case <-locks.arrived:
	case <-time.After(waitLimit):
		t.Fatal("the claim's update never reached the runtime")
	}

	// A container is created meanwhile: CRI-O takes its lock, which the update holds.
	pod, ctr := bestEffort("scratch")
	created := make(chan error, 1)
	go func() {
		if !locks.crio.within(waitLimit) {
			created <- fmt.Errorf("CRI-O's lock stayed taken for %v", waitLimit)
			return
		}
		defer locks.crio.unlock()
		if !locks.adaptation.within(deadlockLimit) {
			created <- fmt.Errorf("the runtime deadlocked: the event holds CRI-O's lock and waited %v for the "+
				"adaptation's, which a second UpdateContainers took while the first was applied", deadlockLimit)
			return
		}
		defer locks.adaptation.unlock()
		_, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
		created <- err
	}()

	// The agent gives up on the first update after the runtime's request timeout (2 s) and tries
	// again; give it time to send a second one.
	select {
	case <-locks.arrived:
		t.Log("a second UpdateContainers reached the runtime while it applied the first")
	case <-time.After(3 * time.Second):
	}
	close(slow)
	released = true
	if err := <-created; err != nil {
		t.Fatalf("CreateContainer: %v; logs:\n%s", err, c.logs.String())
	}
	// Neither the runtime nor the agent is stuck: the web container ends up with an update.
	if web := c.nextUpdate("web-app").GetLinux().GetResources().GetCpu().GetCpus(); web == "" {
		t.Fatal("web-app was updated to no cpuset")
	}
}
