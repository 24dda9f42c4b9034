// Start-up reconciliation as an operator meets it, through the shipped binary (`resmgr run`,
// with the policy the binary wires in) against containerd's NRI adaptation and the fake API
// server: a stray CDI spec next to an intact state, a lost state directory, unreadable specs,
// a claim taken back and then deleted, and a container whose updates the runtime refuses.
package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

const (
	strayUID  = "c0ffee00-0000-4000-8000-0000000000aa"
	unusedUID = "c0ffee00-0000-4000-8000-0000000000bb"
)

func (c *cluster) specPath(uid string) string {
	return c.path("cdi", driver+"-device_"+uid+".json")
}

// plant writes a spec of ours granting cpus on memory node mems to claim uid, as an earlier
// agent would have written it.
func (c *cluster) plant(uid, cpus, mems string) {
	c.t.Helper()
	spec := fmt.Sprintf(`{"cdiVersion":"0.3.0","kind":"%s/device","devices":[{"name":"claim-%s-0",`+
		`"containerEdits":{"env":["DRA_CPUSET_%s=%s","DRA_MEMS_%s=%s"]}}]}`, driver, uid, uid, cpus, uid, mems)
	c.write(c.specPath(uid), spec)
}

func (c *cluster) write(path, data string) {
	c.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (c *cluster) stop() {
	c.t.Helper()
	if err := c.agent.Process.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatal(err)
	}
	select {
	case err := <-c.exited:
		if err != nil {
			c.t.Fatalf("resmgr run exited with %v after SIGTERM", err)
		}
	case <-time.After(waitLimit):
		c.t.Fatal("resmgr run did not stop after SIGTERM")
	}
	// Counts the runtime reported for the stopped agent must not pass for the restarted one's
	// (ready() waits for a count of 1, which only a new Synchronize reports).
	for {
		select {
		case <-c.active:
		default:
			return
		}
	}
}

// alsoRunning adds a container to what the runtime reports at the next Synchronize.
func (c *cluster) alsoRunning(pod *api.PodSandbox, ctr *api.Container) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running = append(c.running, pod)
	c.containers = append(c.containers, ctr)
}

func (c *cluster) prepare(t *testing.T, dra drav1.DRAPluginClient, name, uid string) *drav1.NodePrepareResourceResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := dra.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{
		Claims: []*drav1.Claim{{Namespace: "default", Name: name, Uid: uid}}})
	if err != nil {
		t.Fatalf("NodePrepareResources of %s: %v", name, err)
	}
	return resp.Claims[uid]
}

// claimedCPUs is what the spec of claim uid gives a container, as the runtime's CDI cache
// injects it.
func (c *cluster) claimedCPUs(uid string) string {
	prefix := "DRA_CPUSET_" + uid + "="
	for _, e := range c.inject(fmt.Sprintf("%s/device=claim-%s-0", driver, uid)) {
		if strings.HasPrefix(e, prefix) {
			return strings.TrimPrefix(e, prefix)
		}
	}
	c.t.Fatalf("the spec of %s sets no %s", uid, prefix)
	return ""
}

func (c *cluster) metric(want string) bool {
	_, metrics := get(c.t, "http://"+c.metrics+"/metrics")
	return strings.Contains(metrics, want)
}

// A spec of ours next to an intact state that no container uses and the API server does not
// allocate here (a restored backup, a failed cleanup): the agent starts, is ready, sweeps it,
// and its CPUs go to the next claim.
func TestStraySpecIsSwept(t *testing.T) {
	c := start(t)
	c.ready()
	c.stop()
	// All of numa1: while it is held, db-cpus (two CPUs of numa1) cannot be granted.
	c.plant(strayUID, "8-15", "1")

	c.launch()
	endpoint := c.ready()
	c.waitFor("the stray spec to be swept", func() bool {
		return c.metric(`resmgr_reconciled_claims_total{outcome="swept"} 1`)
	})
	if exists(c.specPath(strayUID))() {
		t.Fatal("the swept stray's spec is still there")
	}
	got := c.prepare(t, draClient(t, endpoint), "db-cpus", claimUID)
	if got == nil || got.Error != "" {
		t.Fatalf("prepare of two CPUs of numa1, which the swept stray held, answered %+v", got)
	}
}

// The state directory is lost while a claim's pod runs: the agent adopts the claim from its spec
// and the kubelet's re-prepare finds the same CPUs.
func TestLostStateDirIsAdopted(t *testing.T) {
	c := start(t)
	dra := draClient(t, c.ready())
	if got := c.prepare(t, dra, "db-cpus", claimUID); got == nil || got.Error != "" {
		t.Fatalf("prepare answered %+v", got)
	}
	claimed := c.claimedCPUs(claimUID)
	cdiID := fmt.Sprintf("%s/device=claim-%s-0", driver, claimUID)
	c.alsoRunning(&api.PodSandbox{Id: "sb-db", Name: "db", Uid: podDB, Namespace: "default",
		Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-poddb.slice"}},
		&api.Container{Id: "db-postgres", PodSandboxId: "sb-db", Name: "postgres", State: api.ContainerState_CONTAINER_RUNNING,
			Env: c.inject(cdiID), CDIDevices: []*api.CDIDevice{{Name: cdiID}},
			Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{Cpus: claimed, Mems: "1"}}}})
	c.stop()
	if err := os.RemoveAll(c.path("state")); err != nil {
		t.Fatal(err)
	}

	c.launch()
	dra = draClient(t, c.ready())
	if !c.metric(`resmgr_reconciled_claims_total{outcome="adopted"} 1`) {
		t.Fatal("the claim's adoption is not counted")
	}
	if got := c.prepare(t, dra, "db-cpus", claimUID); got == nil || got.Error != "" {
		t.Fatalf("the kubelet's re-prepare answered %+v", got)
	}
	if again := c.claimedCPUs(claimUID); again != claimed {
		t.Fatalf("re-prepared onto %q, the pod runs on %q", again, claimed)
	}
	c.waitFor("the re-prepare confirming the claim", func() bool {
		return c.metric(`resmgr_reconciled_claims_total{outcome="confirmed"} 1`)
	})
}

// Unreadable specs: one a running container uses keeps that container's CPUs out of every grant;
// one nothing uses is moved aside, not deleted.
func TestUnreadableSpecs(t *testing.T) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2",
		running: []*api.PodSandbox{{Id: "sb-held", Name: "held", Uid: "pod-held-uid", Namespace: "default",
			Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-podheld.slice"}}},
		containers: []*api.Container{{Id: "held-app", PodSandboxId: "sb-held", Name: "app", State: api.ContainerState_CONTAINER_RUNNING,
			Env:   []string{"DRA_CPUSET_" + strayUID + "=8-9", "DRA_MEMS_" + strayUID + "=1"},
			Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{Cpus: "8-9", Mems: "1"}}}}},
		before: func(c *cluster) {
			c.write(c.specPath(strayUID), "{\"cdiVersion\": tru")
			c.write(c.specPath(unusedUID), "\x00\x01")
		}})
	endpoint := c.ready()
	if !exists(c.specPath(unusedUID)+".unreadable")() || exists(c.specPath(unusedUID))() {
		t.Fatal("the unused unreadable spec was not moved aside to <file>.unreadable")
	}
	if !exists(c.specPath(strayUID))() {
		t.Fatal("the used unreadable spec is gone")
	}
	got := c.prepare(t, draClient(t, endpoint), "db-cpus", claimUID)
	if got == nil || got.Error != "" {
		t.Fatalf("prepare answered %+v", got)
	}
	if cpus := c.claimedCPUs(claimUID); overlaps(cpus, "8-9") {
		t.Fatalf("db-cpus got %q, which held-app's unreadable claim holds", cpus)
	}
	for _, want := range []string{`resmgr_reconciled_claims_total{outcome="held-unreadable"} 1`,
		`resmgr_reconciled_claims_total{outcome="set-aside"} 1`} {
		if !c.metric(want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
}

// A claim taken back after a lost state directory whose pod is gone and whose ResourceClaim is
// then deleted is released after the grace period: spec removed, CPUs back.
func TestDeletedClaimIsReleased(t *testing.T) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2",
		args: []string{"--unconfirmed-claim-grace", "1s"}})
	if got := c.prepare(t, draClient(t, c.ready()), "db-cpus", claimUID); got == nil || got.Error != "" {
		t.Fatalf("prepare answered %+v", got)
	}
	c.stop()
	if err := os.RemoveAll(c.path("state")); err != nil {
		t.Fatal(err)
	}
	c.launch()
	c.ready()
	c.waitFor("the API server's allocation to keep the claim adopted", func() bool {
		return c.metric(`resmgr_reconciled_claims_total{outcome="adopted"} 1`)
	})
	if !exists(c.specPath(claimUID))() {
		t.Fatal("an adopted claim allocated here lost its spec")
	}
	if _, err := fmt.Fprintf(c.api, "delete resourceclaims default db-cpus\n"); err != nil {
		t.Fatal(err)
	}
	if answer, err := c.answers.ReadString('\n'); err != nil || answer != "deleted\n" {
		t.Fatalf("deleting the claim: %q %v", answer, err)
	}
	// Counted once the release is done, spec removed first.
	c.waitFor("the claim to be released", func() bool {
		return c.metric(`resmgr_reconciled_claims_total{outcome="released"} 1`)
	})
	if exists(c.specPath(claimUID))() {
		t.Fatal("the released claim's spec is still there")
	}
	if code, _ := get(t, "http://"+c.metrics+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz answered %d after the release", code)
	}
}

// A container whose updates the runtime refuses holds back only the claims on CPUs it may run
// on: the binary's wiring hands the manager the policy's claim_cpus.
func TestRefusedContainerIsLocal(t *testing.T) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", dropUpdates: true,
		running: []*api.PodSandbox{{Id: "sb-stuck", Name: "stuck", Uid: "pod-stuck-uid", Namespace: "default",
			Linux: &api.LinuxPodSandbox{CgroupParent: "kubepods-burstable-podstuck.slice"}}},
		containers: []*api.Container{{Id: "stuck-app", PodSandboxId: "sb-stuck", Name: "app", State: api.ContainerState_CONTAINER_RUNNING,
			Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{
				Shares: &api.OptionalUInt64{Value: 512}, Cpus: "1-7", Mems: "0"}}}}}})
	c.mu.Lock()
	c.refuse["stuck-app"] = true
	c.mu.Unlock()
	dra := draClient(t, c.ready())
	// cache-cpus takes CPUs of numa0, where stuck-app runs and never moves: it fails.
	if got := c.prepare(t, dra, "cache-cpus", unpinnedUID); got == nil || !strings.Contains(got.Error, "not delivered") {
		t.Fatalf("cache-cpus, on stuck-app's CPUs, answered %+v", got)
	}
	// db-cpus takes CPUs of numa1, where stuck-app cannot run: it does not wait for it.
	if got := c.prepare(t, dra, "db-cpus", claimUID); got == nil || got.Error != "" {
		t.Fatalf("db-cpus, on numa1, answered %+v: held back by a container elsewhere", got)
	}
}
