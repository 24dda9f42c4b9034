package clusterscenarios

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// upgradeAgent runs helm upgrade with the node's values and extra over them, and restores the
// node's values when the test ends.
func upgradeAgent(t *testing.T, name string, extra map[string]any) {
	t.Helper()
	values, err := node.ValuesFile(name, extra)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		values, err := node.ValuesFile("values.json", nil)
		if err == nil {
			_, err = node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values, "--wait", "--timeout", "3m")
		}
		if err != nil {
			t.Errorf("restoring the chart's values: %v", err)
		}
	})
}

// `cpu-exclusivity: pods` (classic nri-plugins), set with helm upgrade: the agent publishes its
// pool with no devices (one empty slice: the driver runs here and offers nothing), so the
// scheduler never allocates a claim on this node, while the kubelet admits a Guaranteed pod of
// whole CPUs and the agent gives it CPUs of its own through NRI; a BestEffort pod runs on none
// of them. The agent's CPU request is 0 here, so that a Guaranteed pod of one CPU fits a 2-CPU
// node with one reserved (docs/deploy.md).
func TestPodsExclusivityPublishesAnEmptyPoolAndPinsGuaranteedPods(t *testing.T) {
	ns := namespace(t)
	// Claims of the tests before this one go with their namespaces; the agent must not be
	// switched while it holds them.
	poll(t, "the claims of earlier tests to be gone", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		claims, err := node.Client.ResourceV1().ResourceClaims("").List(c, metav1.ListOptions{})
		return err == nil && len(claims.Items) == 0, err
	})
	upgradeAgent(t, "values-pods-exclusivity.json", map[string]any{
		"config":    map[string]any{"cpu-exclusivity": "pods"},
		"resources": map[string]any{"requests": map[string]any{"cpu": "0"}},
	})
	poll(t, "one empty slice", limit, func() (bool, error) {
		s := nodeSlices(t)
		return len(s) == 1 && len(s[0].Spec.Devices) == 0 && s[0].Spec.Pool.ResourceSliceCount == 1, nil
	})

	whole := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("64Mi")}
	// Created together, so the BestEffort container may still be in creation when the Guaranteed
	// one takes its CPU: the runtime skips updates of a container it has not stored yet, and the
	// agent must send the update again once it has (tests/conformance/agent/creating_test.go).
	create(t, ns, podSpec{name: "exclusive", requests: whole, limits: whole})
	create(t, ns, podSpec{name: "besteffort"})
	exclusive, besteffort := running(t, ns, "exclusive"), running(t, ns, "besteffort")
	own := placement(t, exclusive, "app").CgroupCPUs
	if n := len(cpus(t, own)); n != 1 || overlaps(t, own, onenode.ReservedCPUs) {
		t.Fatalf("the Guaranteed pod runs on %q, want one CPU of its own, not the reserved %q", own, onenode.ReservedCPUs)
	}
	poll(t, "the BestEffort pod to run off the exclusive CPU "+own, limit, func() (bool, error) {
		now := placement(t, besteffort, "app").CgroupCPUs
		return now != "" && !overlaps(t, now, own), nil
	})
	t.Logf("kernel: the Guaranteed pod runs on %q, the BestEffort one on %q", own, placement(t, besteffort, "app").CgroupCPUs)

	claimTemplate(t, ns, "nowhere", 1)
	create(t, ns, podSpec{name: "claim", template: "nowhere"})
	var reason string
	poll(t, "the scheduler to find no device for the claim", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		pod, err := node.Client.CoreV1().Pods(ns).Get(c, "claim", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				reason = cond.Message
				return strings.Contains(reason, "cannot allocate all claims"), nil
			}
		}
		return false, nil
	})
	t.Logf("scheduler: %s", reason)
	for _, name := range []string{"claim", "exclusive", "besteffort"} {
		deletePod(t, ns, name)
	}
}
