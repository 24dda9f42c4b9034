package clusterscenarios

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// chartCPURequest is the agent's CPU request in the chart's default values.
func chartCPURequest(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(node.Chart(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Resources struct {
			Requests map[string]string `json:"requests"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	cpu := values.Resources.Requests["cpu"]
	if q, err := resource.ParseQuantity(cpu); err != nil || q.IsZero() {
		t.Fatalf("the chart's values.yaml requests CPU %q for the agent; this test shows what a request costs", cpu)
	}
	return cpu
}

// A pod that claims every CPU the node publishes and, as docs/deploy.md asks, states them again
// in resources.requests, does not fit next to the agent's own pod with the chart's default
// request (50m of CPU come out of the same allocatable CPUs): the scheduler says "Insufficient
// cpu". With the agent's CPU request at 0, which docs/deploy.md recommends where claims should
// get every CPU (the agent runs on the reserved CPUs either way) and the node installs
// (onenode.AgentCPURequest), it runs on all of them.
func TestTheAgentsCPURequestCountsAgainstAClaimOfEveryCPU(t *testing.T) {
	ns := namespace(t)
	began := time.Now()
	chart := chartCPURequest(t)
	upgradeAgent(t, "values-chart-cpu-request.json", map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": chart}}})
	all := len(cpus(t, sharedCPUs(t)))
	claimTemplate(t, ns, "every-cpu", all)
	whole := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(strconv.Itoa(all)), corev1.ResourceMemory: resource.MustParse("64Mi")}
	create(t, ns, podSpec{name: "everything", template: "every-cpu", requests: whole, limits: whole})
	var reason string
	poll(t, "the scheduler to refuse the pod for cpu", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		pod, err := node.Client.CoreV1().Pods(ns).Get(c, "everything", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				reason = cond.Message
				return strings.Contains(reason, "Insufficient cpu"), nil
			}
		}
		return false, nil
	})
	t.Logf("with the chart's default request (%s) the scheduler says (after %s): %s", chart, time.Since(began).Round(time.Millisecond), reason)

	values, err := node.ValuesFile("values.json", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	// The same pod again: the scheduler retries the one it refused only after a minute or more
	// here, though the old agent's pod went (its backoff and queueing, not what is tested).
	deletePod(t, ns, "everything")
	create(t, ns, podSpec{name: "everything", template: "every-cpu", requests: whole, limits: whole})
	pod := running(t, ns, "everything")
	t.Logf("with the node's request the same pod runs %s after the test began", time.Since(began).Round(time.Millisecond))
	p := placement(t, pod, "app")
	if granted := grantedCPUs(t, p, podClaim(t, pod)); p.CgroupCPUs != granted || !same(t, granted, sharedCPUs(t)) {
		t.Fatalf("the pod runs on %q, its claim holds %q, the node publishes %q", p.CgroupCPUs, granted, sharedCPUs(t))
	}
	t.Logf("with the node's request (%s) the pod runs on every claimable CPU, %q", onenode.AgentCPURequest, p.CgroupCPUs)
	deletePod(t, ns, "everything")
}
