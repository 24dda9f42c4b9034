// Containers the runtime has not started yet. containerd calls the plugins' CreateContainer while
// it builds the container, and adds the container to its store only after that call returns, then
// sends PostCreateContainer (CRI-O does the same with its server). An update of the container in
// between, in another event's reply or in UpdateContainers, finds no container: both runtimes
// skip it and report it as applied. Until the container runs (PostStartContainer), containerd
// writes an update into the container's spec only, which the task it starts may already have
// been made from. Here the runtime behind containerd's own NRI adaptation skips the updates of
// the containers in c.creating, and the agent must deliver such an update once the container
// has started, and never grant a claim CPUs such a container still runs on.
package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
)

// createBestEffort creates a BestEffort container as the runtime does: the CreateContainer call,
// after which the runtime skips its updates until postStart. Returns the CPUs the agent created
// it on.
func (c *cluster) createBestEffort(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) string {
	c.t.Helper()
	c.mu.Lock()
	c.creating[ctr.Id] = true
	c.mu.Unlock()
	resp, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		c.t.Fatalf("CreateContainer of %s: %v", ctr.Id, err)
	}
	c.applyReply(resp.GetUpdate())
	got := resp.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus()
	if got == "" {
		c.t.Fatalf("%s was created on no cpuset of the agent's", ctr.Id)
	}
	return got
}

// applyReply applies the updates of an event's reply as containerd does: the containers it is
// creating are skipped. Returns the updates skipped, by container.
func (c *cluster) applyReply(updates []*api.ContainerUpdate) map[string]*api.ContainerUpdate {
	c.mu.Lock()
	defer c.mu.Unlock()
	skipped := map[string]*api.ContainerUpdate{}
	for _, u := range updates {
		if c.creating[u.ContainerId] {
			skipped[u.ContainerId] = u
		} else if cpus := u.GetLinux().GetResources().GetCpu().GetCpus(); cpus != "" {
			c.applied[u.ContainerId] = cpus
		}
	}
	return skipped
}

// appliedCPUs is the cpuset the runtime applied to a container last, by an update.
func (c *cluster) appliedCPUs(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied[id]
}

// activeWithoutDRA waits until the agent, started with `--dra false`, is an active NRI plugin.
func (c *cluster) activeWithoutDRA() {
	c.t.Helper()
	for n := 0; n != 1; {
		select {
		case n = <-c.active:
		case err := <-c.exited:
			c.t.Fatalf("resmgr run exited (%v) before registering with the runtime", err)
		case <-time.After(waitLimit):
			c.t.Fatal("resmgr never became an active NRI plugin")
		}
	}
}

// postStart finishes the creation and the start: the runtime runs the container and applies its
// updates, then says so.
func (c *cluster) postStart(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	c.t.Helper()
	if err := c.runtime.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: ctr}); err != nil {
		c.t.Fatalf("PostCreateContainer of %s: %v", ctr.Id, err)
	}
	if err := c.runtime.StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: ctr}); err != nil {
		c.t.Fatalf("StartContainer of %s: %v", ctr.Id, err)
	}
	c.mu.Lock()
	delete(c.creating, ctr.Id)
	c.mu.Unlock()
	if err := c.runtime.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: ctr}); err != nil {
		c.t.Fatalf("PostStartContainer of %s: %v", ctr.Id, err)
	}
}

func bestEffort(name string) (*api.PodSandbox, *api.Container) {
	pod := &api.PodSandbox{Id: "sb-" + name, Name: name, Uid: "pod-" + name + "-uid", Namespace: "jobs",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-besteffort-pod" + name + ".slice"}}
	ctr := &api.Container{Id: name + "-main", PodSandboxId: pod.Id, Name: "main",
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 2}}}}}
	return pod, ctr
}

// A Guaranteed container created while a BestEffort one is still being created takes CPUs the
// BestEffort one was created on. The reply's update of the BestEffort container reaches no one;
// once the runtime has started it, the agent sends it again, off the exclusive CPUs.
func TestUpdateAfterStart(t *testing.T) {
	c := startWith(t, false)
	c.activeWithoutDRA()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	pod, ctr := bestEffort("scratch")
	before := c.createBestEffort(ctx, pod, ctr)

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
	if !overlaps(before, exclusive) {
		t.Fatalf("the Guaranteed container got %q, none of the %q the BestEffort one was created on: nothing to check", exclusive, before)
	}
	skipped := c.applyReply(guaranteed.GetUpdate())
	moved := skipped[ctr.Id].GetLinux().GetResources().GetCpu().GetCpus()
	if moved == "" || overlaps(moved, exclusive) {
		t.Fatalf("the reply moved %s to %q (skipped updates %v); the exclusive CPUs are %q", ctr.Id, moved, skipped, exclusive)
	}

	c.postStart(ctx, pod, ctr)
	if got := c.nextUpdate(ctr.Id).GetLinux().GetResources().GetCpu().GetCpus(); got != moved {
		t.Fatalf("once started, %s was updated to %q, want %q (off the exclusive %q)", ctr.Id, got, moved, exclusive)
	}
	c.waitFor("no pending updates", func() bool { return c.metric("resmgr_pending_updates 0") })
}

// A claim prepared while a container that runs on its CPUs is still being created waits for the
// runtime to start it, up to 10 s, and fails naming it if it never does: the claim is not granted
// CPUs that container may keep. Once it has started, the kubelet's retry succeeds and the
// container is moved off the claim's CPUs first.
func TestClaimWaitsForStart(t *testing.T) {
	c := start(t)
	dra := draClient(t, c.ready())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	pod, ctr := bestEffort("scratch")
	before := c.createBestEffort(ctx, pod, ctr)

	refused := c.prepare(t, dra, "cache-cpus", unpinnedUID)
	if refused.GetError() == "" || !strings.Contains(refused.GetError(), ctr.Id) || !strings.Contains(refused.GetError(), "creating") {
		t.Fatalf("prepare answered %+v while %s (on %q) was not started; want an error naming it", refused, ctr.Id, before)
	}
	if exists(c.specPath(unpinnedUID))() {
		t.Fatal("the refused claim has a CDI spec")
	}

	c.postStart(ctx, pod, ctr)
	granted := c.prepare(t, dra, "cache-cpus", unpinnedUID)
	if granted.GetError() != "" {
		t.Fatalf("the retried prepare failed: %s", granted.GetError())
	}
	claimed := c.claimedCPUs(unpinnedUID)
	if !overlaps(before, claimed) {
		t.Fatalf("the claim got %q, none of the %q %s was created on: nothing to check", claimed, before, ctr.Id)
	}
	// Granted only once the runtime has the container off the claim's CPUs.
	if got := c.appliedCPUs(ctr.Id); got == "" || overlaps(got, claimed) {
		t.Fatalf("the claim was granted %q while the runtime has %s on %q", claimed, ctr.Id, got)
	}
}

// A container created while no agent was connected (the gap of a restart or a handover) and
// being started when the agent synchronizes: the runtime lists it as created and drops the
// Synchronize reply's update of it (containerd writes it into the spec the task was already
// made from). Once the runtime has started it, the agent sends that update again. Before, the
// reply counted as the delivery, and a claim pod created during a helm upgrade ran on the shared
// CPUs besides its claim's.
func TestAContainerStartingAtSynchronizeIsUpdatedOnceRunning(t *testing.T) {
	pod := &api.PodSandbox{Id: "sb-batch", Name: "batch", Uid: "pod-batch-uid", Namespace: "jobs",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-podbatch.slice"}}
	// Created as the kubelet asked, on every CPU: no plugin adjusted it.
	ctr := &api.Container{Id: "batch-worker", PodSandboxId: pod.Id, Name: "worker", State: api.ContainerState_CONTAINER_CREATED,
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{
			Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 2048}, Cpus: "0-15", Mems: "0-1",
				Quota: &api.OptionalInt64{Value: 200000}, Period: &api.OptionalUInt64{Value: 100000}},
			Memory: &api.LinuxMemory{Limit: &api.OptionalInt64{Value: 1 << 30}}}}}
	c := startSetup(t, setup{topology: "pack:1 numa:2 core:4 pu:2",
		running: []*api.PodSandbox{pod}, containers: []*api.Container{ctr},
		before: func(c *cluster) { c.creating[ctr.Id] = true }})
	c.activeWithoutDRA()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	c.mu.Lock()
	var want string
	for _, u := range c.synced {
		if u.ContainerId == ctr.Id {
			want = u.GetLinux().GetResources().GetCpu().GetCpus()
		}
	}
	c.mu.Unlock()
	if want == "" || want == "0-15" {
		t.Fatalf("the Synchronize reply moved %s to %q: nothing to check", ctr.Id, want)
	}

	c.postStart(ctx, pod, ctr)
	if got := c.nextUpdate(ctr.Id).GetLinux().GetResources().GetCpu().GetCpus(); got != want {
		t.Fatalf("once started, %s was updated to %q, want %q (what the dropped Synchronize reply said)", ctr.Id, got, want)
	}
	c.waitFor("no pending updates", func() bool { return c.metric("resmgr_pending_updates 0") })
}
