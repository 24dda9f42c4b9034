// Containers a runtime's Synchronize does not list. containerd holds a plugin's synchronization
// while it creates, starts, updates or stops a container (BlockPluginSync), so its Synchronize
// lists every container it has, created ones included. CRI-O 1.36 does not: it lists the
// containers in its server, and adds a container there only once it has created it, after the
// CreateContainer call to the plugins. A container whose CreateContainer went to the plugins
// while the agent was away (the gap of a restart or a handover; an event in flight when the old
// agent disconnected fails for that plugin and goes on without its adjustment) and that CRI-O
// adds right after listing is in no Synchronize: the agent first hears of it at a later event,
// PostCreateContainer, PostStartContainer, an UpdateContainer. Here the runtime behind
// containerd's own NRI adaptation does what CRI-O does: the syncFn creates containers (through
// the adaptation, which calls no plugin: the agent is not in its list yet) before it lists the
// others, and leaves them out.
package agent

import (
	"context"
	"fmt"
	"testing"

	"github.com/containerd/nri/pkg/api"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// createDuringSync makes the agent's next Synchronize create ctrs first, with no plugin to adjust
// them, and list only the others: CRI-O creating them while it synchronizes the agent. The
// runtime skips their updates until they start (see creating_test.go).
func (c *cluster) createDuringSync(pods []*api.PodSandbox, ctrs []*api.Container) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ctr := range ctrs {
		c.creating[ctr.Id] = true
	}
	c.duringSync = func(ctx context.Context) {
		for i, ctr := range ctrs {
			resp, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pods[i], Container: ctr})
			if err != nil {
				c.t.Errorf("CreateContainer of %s during the Synchronize: %v", ctr.Id, err)
				continue
			}
			if cpus := resp.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus(); cpus != "" {
				c.t.Errorf("%s was created on %q during the Synchronize: no plugin should have adjusted it", ctr.Id, cpus)
			}
		}
	}
}

// postCreate sends PostCreateContainer: the runtime has created the container.
func (c *cluster) postCreate(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	c.t.Helper()
	if err := c.runtime.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: ctr}); err != nil {
		c.t.Fatalf("PostCreateContainer of %s: %v", ctr.Id, err)
	}
}

// startAfterCreate starts a container the runtime has created and announced: StartContainer, the
// runtime runs it (and applies its updates from then on), PostStartContainer.
func (c *cluster) startAfterCreate(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	c.t.Helper()
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

// onEveryCPU names what the runtime applied to a container: "" is no cpuset of ours, which runs
// it on every CPU, as the kubelet created it.
func onEveryCPU(applied string) string {
	if applied == "" {
		return "every CPU (no update applied)"
	}
	return applied
}

// A plain container and a claim's container are created while the restarted agent synchronizes,
// and left out of the Synchronize as CRI-O leaves them; then the runtime announces them
// (PostCreateContainer) and starts them. The plain container must end off the claims' CPUs, the
// claim's container on its claim's, in what the runtime applied; and a claim prepared meanwhile
// is granted only once neither can run on its CPUs any more. Before, the agent only noted their
// start: both kept every CPU, and in a rollout on CRI-O a plain pod ran on a claim's CPU.
func TestUnlistedContainerIsPlaced(t *testing.T) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", dropUpdates: true})
	dra := draClient(t, c.ready())
	if got := c.prepare(t, dra, "cache-cpus", unpinnedUID); got == nil || got.Error != "" {
		t.Fatalf("prepare of cache-cpus answered %+v", got)
	}
	cacheCPUs := c.claimedCPUs(unpinnedUID)
	c.stop()

	plainPod, plain := bestEffort("plain")
	cachePod := &api.PodSandbox{Id: "sb-cache", Name: "cache", Uid: podCache, Namespace: "default",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-podcache.slice"}}
	cdiID := fmt.Sprintf("%s/device=claim-%s-0", driver, unpinnedUID)
	cache := &api.Container{Id: "cache-main", PodSandboxId: cachePod.Id, Name: "main",
		Env: c.inject(cdiID), CDIDevices: []*api.CDIDevice{{Name: cdiID}},
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{
			Shares: &api.OptionalUInt64{Value: 2048}, Quota: &api.OptionalInt64{Value: 200000},
			Period: &api.OptionalUInt64{Value: 100000}}}}}
	c.createDuringSync([]*api.PodSandbox{plainPod, cachePod}, []*api.Container{plain, cache})

	c.launch()
	dra = draClient(t, c.ready())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c.postCreate(ctx, plainPod, plain)
	c.postCreate(ctx, cachePod, cache)

	// The kubelet prepares another pod's claim (two CPUs of numa1) while they start.
	prepared := make(chan *drav1.NodePrepareResourceResponse, 1)
	go func() {
		resp, err := dra.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{
			Claims: []*drav1.Claim{{Namespace: "default", Name: "db-cpus", Uid: claimUID}}})
		if err != nil {
			t.Errorf("NodePrepareResources of db-cpus: %v", err)
			prepared <- nil
			return
		}
		prepared <- resp.Claims[claimUID]
	}()
	c.startAfterCreate(ctx, plainPod, plain)
	c.startAfterCreate(ctx, cachePod, cache)

	got := <-prepared
	if got == nil || got.Error != "" {
		t.Fatalf("prepare of db-cpus answered %+v", got)
	}
	// At the instant db-cpus is granted, the runtime has both containers where they belong.
	dbCPUs := c.claimedCPUs(claimUID)
	if on := c.appliedCPUs(plain.Id); on == "" || overlaps(on, dbCPUs) || overlaps(on, cacheCPUs) {
		t.Fatalf("db-cpus was granted %q while the runtime ran %s on %s; cache-cpus holds %q",
			dbCPUs, plain.Id, onEveryCPU(on), cacheCPUs)
	}
	if on := c.appliedCPUs(cache.Id); on != cacheCPUs {
		t.Fatalf("db-cpus was granted %q while the runtime ran %s, cache-cpus's container, on %s; its claim holds %q",
			dbCPUs, cache.Id, onEveryCPU(on), cacheCPUs)
	}
	c.waitFor("no pending updates", func() bool { return c.metric("resmgr_pending_updates 0") })
}

// A container left out of the Synchronize whose PostCreateContainer and PostStartContainer the
// agent did not get (CRI-O inserts a plugin into its list a moment after synchronizing it: the
// events of that moment reach no one), resized by the kubelet: the agent places it and answers
// the update with where it runs. Before, the update failed: the policy did not know the
// container, and the runtime failed the kubelet's resize.
func TestUnlistedContainerResized(t *testing.T) {
	c := startWith(t, false)
	c.activeWithoutDRA()
	c.stop()

	pod := &api.PodSandbox{Id: "sb-api", Name: "api", Uid: "pod-api-uid", Namespace: "jobs",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-burstable-podapi.slice"}}
	ctr := &api.Container{Id: "api-server", PodSandboxId: pod.Id, Name: "server",
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 512}}}}}
	c.createDuringSync([]*api.PodSandbox{pod}, []*api.Container{ctr})
	c.launch()
	c.activeWithoutDRA()
	c.mu.Lock()
	delete(c.creating, ctr.Id)
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := c.runtime.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: ctr,
		LinuxResources: &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 1024}}}})
	if err != nil {
		t.Fatalf("the resize of %s, which the Synchronize did not list, failed: %v", ctr.Id, err)
	}
	var own string
	for _, u := range resp.GetUpdate() {
		if u.ContainerId == ctr.Id {
			own = u.GetLinux().GetResources().GetCpu().GetCpus()
		}
	}
	// The shared CPUs: every CPU but the reserved CPU 0.
	if own == "" || cpus(own)[0] {
		t.Fatalf("the resize of %s answered %+v: want it placed on shared CPUs, off the reserved CPU 0", ctr.Id, resp.GetUpdate())
	}
}
