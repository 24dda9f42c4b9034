package clusterscenarios

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The real kubelet streams device health from the agent in the version its release prefers:
// 1.36 opens v1alpha1 on every plugin, 1.37 the v1 the agent lists in GetInfo. A claim pod's
// container then shows its device Healthy in allocatedResourcesStatus, and the kubelet never
// got Unimplemented from the agent's health service so far in the run.
func TestTheKubeletStreamsDeviceHealthInTheVersionItsReleasePrefers(t *testing.T) {
	want := "v1alpha1"
	if serverMinor(t) >= 37 {
		want = "v1"
	}
	agent := agentPod(t)
	poll(t, "the agent to log the kubelet's health stream", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		log, err := node.Client.CoreV1().Pods(agent.Namespace).GetLogs(agent.Name, &corev1.PodLogOptions{}).Do(c).Raw()
		if err != nil {
			return false, err
		}
		for _, line := range strings.Split(string(log), "\n") {
			var entry struct{ Message, Version string }
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Message == "the kubelet opened a resource health stream" {
				if entry.Version != want {
					t.Fatalf("the kubelet opened the health stream in %q, want %q: %s", entry.Version, want, line)
				}
				return true, nil
			}
		}
		return false, nil
	})

	ns := namespace(t)
	claimTemplate(t, ns, "one-cpu", 1)
	create(t, ns, podSpec{name: "watched", template: "one-cpu"})
	running(t, ns, "watched")
	poll(t, "the claim's device to show Healthy in the pod's status", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		pod, err := node.Client.CoreV1().Pods(ns).Get(c, "watched", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, status := range pod.Status.ContainerStatuses {
			for _, claim := range status.AllocatedResourcesStatus {
				for _, r := range claim.Resources {
					if !strings.HasPrefix(string(r.ResourceID), driver+"/") {
						continue
					}
					if r.Health != corev1.ResourceHealthStatusHealthy {
						t.Fatalf("the kubelet says the claim's device %s is %q", r.ResourceID, r.Health)
					}
					t.Logf("kubelet (%s stream): %s %s is %s", want, claim.Name, r.ResourceID, r.Health)
					return true, nil
				}
			}
		}
		return false, nil
	})
	deletePod(t, ns, "watched")

	kubelet, err := os.ReadFile(node.Log("kubelet"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(kubelet), "\n") {
		if strings.Contains(line, "WatchResources") && strings.Contains(line, "Unimplemented") {
			t.Fatalf("the kubelet got Unimplemented from the agent's health service: %s", line)
		}
	}
}
