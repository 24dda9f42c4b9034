package clusterscenarios

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A pod with a claim from a ResourceClaimTemplate: the real controller-manager makes the claim,
// the real scheduler allocates it from the agent's slices, the real kubelet asks the agent to
// prepare it and passes its CDI device to containerd. The kernel then runs every process of the
// container on exactly the granted CPUs, and a BestEffort pod on none of them. Deleting the pod
// unprepares the claim: the controller deletes the generated claim, the agent removes its CDI
// spec, and the BestEffort pod gets the CPUs back.
func TestATemplateClaimPinsItsPodAndDeletingItGivesTheCPUsBack(t *testing.T) {
	ns := namespace(t)
	create(t, ns, podSpec{name: "shared"})
	shared := running(t, ns, "shared")
	before := placement(t, shared, "app").CgroupCPUs
	t.Logf("kernel: the BestEffort pod runs on %q before the claim", before)

	claimTemplate(t, ns, "one-cpu", 1)
	specsBefore := len(cdiSpecs(t))
	create(t, ns, podSpec{name: "pinned", template: "one-cpu"})
	pinned := running(t, ns, "pinned")
	claim := podClaim(t, pinned)
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 ||
		claim.Status.Allocation.Devices.Results[0].Driver != driver {
		t.Fatalf("claim %s is not allocated from the agent's devices: %+v", claim.Name, claim.Status.Allocation)
	}
	p := placement(t, pinned, "app")
	granted := grantedCPUs(t, p, claim)
	if len(cpus(t, granted)) != 1 || p.CgroupCPUs != granted {
		t.Fatalf("the kernel runs the claim's container on %q (cgroup %s), the agent granted %q (one CPU)", p.CgroupCPUs, p.Cgroup, granted)
	}
	if got := len(cdiSpecs(t)); got != specsBefore+1 {
		t.Fatalf("the agent wrote %d CDI specs for the claim, want 1 (%v)", got-specsBefore, cdiSpecs(t))
	}
	poll(t, "the BestEffort pod to leave the claim's CPUs", limit, func() (bool, error) {
		now := placement(t, shared, "app").CgroupCPUs
		return now != "" && !overlaps(t, now, granted), nil
	})
	t.Logf("kernel: claim %s holds %q, the BestEffort pod runs on %q", claim.Name, granted, placement(t, shared, "app").CgroupCPUs)

	deletePod(t, ns, "pinned")
	poll(t, "the generated claim to be deleted", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		_, err := node.Client.ResourceV1().ResourceClaims(ns).Get(c, claim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	poll(t, "the claim's CDI spec to be removed", limit, func() (bool, error) {
		return len(cdiSpecs(t)) == specsBefore, nil
	})
	poll(t, "the BestEffort pod to get the claim's CPUs back", limit, func() (bool, error) {
		return overlaps(t, placement(t, shared, "app").CgroupCPUs, granted), nil
	})
}

// A claim no device can satisfy leaves its pod Pending with the scheduler's reason, and the
// kubelet never sees it (no container is created).
func TestAnUnsatisfiableClaimLeavesThePodPendingWithTheSchedulersReason(t *testing.T) {
	ns := namespace(t)
	claimTemplate(t, ns, "too-many", 4096)
	create(t, ns, podSpec{name: "waiting", template: "too-many"})
	var reason string
	poll(t, "the scheduler to say why the pod cannot run", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		pod, err := node.Client.CoreV1().Pods(ns).Get(c, "waiting", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				reason = cond.Message
				return pod.Status.Phase == corev1.PodPending && pod.Spec.NodeName == "" && len(pod.Status.ContainerStatuses) == 0, nil
			}
		}
		return false, nil
	})
	if !strings.Contains(reason, "cannot allocate all claims") {
		t.Fatalf("the scheduler's reason is %q, want it to say the claims cannot be allocated", reason)
	}
	t.Logf("scheduler: %s", reason)
}
