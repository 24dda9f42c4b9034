package scenarios

import (
	"context"
	"strconv"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

// On the CRI-O stage's CRI-O (the `OnCRIO` tests run only there, through `cargo xtask e2e`):
// the agent plugs into CRI-O's NRI and publishes this machine's CPUs (all but the first,
// reserved); the real scheduler allocates a claim for half of the largest device (at least one
// CPU); the agent prepares it; CRI-O injects the claim's CDI device into a real container,
// which the kernel then runs on exactly the claim's CPUs, with both names of the cpuset variable
// in its environment. A BestEffort container the scheduler puts next to it runs on other CPUs,
// and gets the claim's CPUs back when the claim's pod goes.
//
// Why the kubelet is played here: the cluster stage runs the real kubelet on containerd only,
// where TestATemplateClaimPinsItsPodAndDeletingItGivesTheCPUsBack checks the same with nothing
// played. On CRI-O, until a cluster runs on it, this is the one claim that the real scheduler
// allocates and a real container uses, so the kubelet's part (registration, prepare and
// unprepare over the DRA socket, the pod's sandbox and container over CRI) is ours.
func TestOnCRIOTheScheduledClaimPinsARealContainer(t *testing.T) {
	crio := node.RealRuntimeFromEnv(t)
	online, err := node.OnlineCPUs()
	if err != nil {
		t.Fatal(err)
	}
	all := cpus(online)
	first := -1
	for c := range all {
		if first < 0 || c < first {
			first = c
		}
	}
	e := start(t, options{topology: "live", reserved: "cpuset:" + strconv.Itoa(first),
		nodeCPU: strconv.Itoa(len(all) - 1), runtime: crio})
	caps := advertised(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) > 0 }))
	var largest int64
	for _, n := range caps {
		largest = max(largest, n)
	}
	if largest == 0 {
		t.Fatalf("this machine (cpus %s) publishes no cpus to claim: %v", online, caps)
	}
	want := max(largest/2, 1)

	be := e.run("best-effort", nil, "")
	pinned := e.run("pinned", &claimSpec{cpu: strconv.FormatInt(want, 10)}, "")
	res := results(pinned.claim)
	if len(res) != 1 {
		t.Fatalf("%s: want one result", describe(pinned.claim))
	}
	consumed := res[0].ConsumedCapacity["cpu"]
	granted := claimCPUs(pinned)
	if consumed.Value() != want || int64(len(cpus(granted))) != want {
		t.Fatalf("%s: the agent granted %q, want %d cpus", describe(pinned.claim), granted, want)
	}
	if pinned.app.Cpus != granted {
		t.Fatalf("the kernel runs the claim's container on %q, the claim holds %q", pinned.app.Cpus, granted)
	}
	shellSafe := "DRA_CPUSET_" + strings.ReplaceAll(string(pinned.claim.UID), "-", "_")
	if got := envValue(pinned.app.Env, shellSafe); got != granted {
		t.Fatalf("the container's %s is %q, want %q (its environment: %v)", shellSafe, got, granted, pinned.app.Env)
	}

	// The BestEffort container runs off the claim's CPUs now, and on them again once it goes.
	if now := e.node.Cpusets()[be.app.ID]; now == "" || overlaps(now, granted) {
		t.Fatalf("the BestEffort container runs on %q next to the claim's %q", now, granted)
	}
	e.remove(pinned)
	e.cp.Poll("the BestEffort container to get the claim's cpus back", func(context.Context) (bool, error) {
		return subset(granted, e.node.Cpusets()[be.app.ID]), nil
	})
	t.Logf("kernel: the BestEffort container runs on %q after the claim went", e.node.Cpusets()[be.app.ID])
}
