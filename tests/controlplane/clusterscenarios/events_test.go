package clusterscenarios

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A claim pod force-deleted (grace period 0) leaves the API at once, so its claim is deallocated
// and the scheduler hands the same CPU to the next claim while the kubelet has not yet stopped
// the old containers nor unprepared the old claim. The agent refuses the new prepare rather than
// grant a CPU twice, and says why in an Event on the pod, which `kubectl describe pod` shows;
// the pod runs on the CPU once the kubelet, retrying, prepares it after the unprepare.
func TestAPrepareRefusedWhileTheCPUsAreStillHeldIsAnEventOnThePodAndRunsLater(t *testing.T) {
	ns := namespace(t)
	// Each claims every CPU the node publishes, so that the second cannot be put elsewhere.
	all := len(cpus(t, sharedCPUs(t)))
	claimTemplate(t, ns, "every-cpu", all)
	// Its container ignores SIGTERM, so that it still holds the CPUs when the next claim is
	// prepared: the kubelet kills it at the end of its grace period (2 s at least).
	first := podSpec{name: "first", template: "every-cpu"}.pod(ns)
	first.Spec.Containers[0].Command = sleepIgnoringSIGTERM
	c, cancel := cx()
	_, err := node.Client.CoreV1().Pods(ns).Create(c, first, metav1.CreateOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	running1 := running(t, ns, "first")
	granted := grantedCPUs(t, placement(t, running1, "app"), podClaim(t, running1))
	c, cancel = cx()
	err = node.Client.CoreV1().Pods(ns).Delete(c, "first", *metav1.NewDeleteOptions(0))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	create(t, ns, podSpec{name: "second", template: "every-cpu"})
	var described string
	poll(t, "the agent's ClaimNotPrepared Event in kubectl describe pod", limit, func() (bool, error) {
		out, err := node.Kubectl("-n", ns, "describe", "pod", "second")
		described = out
		return strings.Contains(out, "ClaimNotPrepared") && strings.Contains(out, "does not fit"), err
	})
	t.Logf("kubectl describe pod second, its events:\n%s", described[strings.Index(described, "Events:"):])
	pod := running(t, ns, "second")
	p := placement(t, pod, "app")
	if got := grantedCPUs(t, p, podClaim(t, pod)); got != p.CgroupCPUs || got != granted {
		t.Fatalf("the second pod runs on %q with %q granted, the first one's claim held %q (every published CPU)", p.CgroupCPUs, got, granted)
	}
	t.Logf("the second pod ran %s after the first was force-deleted", time.Since(began).Round(time.Second))
}
