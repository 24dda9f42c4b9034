package clusterscenarios

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The claim examples of examples/kubernetes, applied as they are with kubectl: the API server
// accepts every object, the controller-manager makes each pod's claim from its template, and each
// pod then either runs on exactly the CPUs its claim was granted or, on a machine too small for
// it (each asks for 2 to 4 CPUs), stays Pending with the scheduler's reason, never stuck on the
// node. The examples are deleted again afterwards.
func TestTheExamplesApplyAsTheyAre(t *testing.T) {
	dir := filepath.Join(filepath.Dir(node.Chart()), "..", "..", "examples", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in %s (%v)", dir, err)
	}
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(text), "kind: ResourceClaimTemplate") {
			continue // topology-aware-without-dra.yaml is for an agent with dra: false
		}
		t.Run(filepath.Base(file), func(t *testing.T) {
			if _, err := node.Kubectl("apply", "-f", file); err != nil {
				t.Fatal(err)
			}
			// The example's sleep ignores SIGTERM: a short grace period, not its 30 s.
			t.Cleanup(func() { _, _ = node.Kubectl("delete", "--wait=true", "--grace-period=1", "-f", file) })
			name := podName(t, string(text))
			var pod *corev1.Pod
			poll(t, "pod "+name+" to run or be refused by the scheduler", limit, func() (bool, error) {
				c, cancel := cx()
				defer cancel()
				var err error
				if pod, err = node.Client.CoreV1().Pods("default").Get(c, name, metav1.GetOptions{}); err != nil {
					return false, err
				}
				if pod.Status.Phase == corev1.PodRunning {
					return true, nil
				}
				for _, cond := range pod.Status.Conditions {
					if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
						return len(pod.Status.ResourceClaimStatuses) == 1, nil
					}
				}
				return false, nil
			})
			claim := podClaim(t, pod)
			if pod.Status.Phase != corev1.PodRunning {
				t.Logf("%s: claim %s made, pod Pending: %s", filepath.Base(file), claim.Name, describePod(pod))
				return
			}
			p := placement(t, pod, "app")
			if granted := grantedCPUs(t, p, claim); p.CgroupCPUs != granted {
				t.Fatalf("the kernel runs %s on %q, its claim holds %q", name, p.CgroupCPUs, granted)
			}
			t.Logf("%s: the pod runs on its claim's %q", filepath.Base(file), p.CgroupCPUs)
		})
	}
}

// podName is the name of the one Pod in a multi-document YAML text.
func podName(t *testing.T, text string) string {
	t.Helper()
	for _, doc := range strings.Split(text, "\n---\n") {
		if !strings.Contains(doc, "\nkind: Pod\n") && !strings.HasPrefix(doc, "kind: Pod\n") {
			continue
		}
		_, rest, ok := strings.Cut(doc, "\nmetadata:\n  name: ")
		if ok {
			name, _, _ := strings.Cut(rest, "\n")
			return strings.TrimSpace(name)
		}
	}
	t.Fatal("the example has no Pod")
	return ""
}
