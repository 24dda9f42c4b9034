package clusterscenarios

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// pinnedPod runs a pod with a one-CPU claim from a template and returns it with its granted
// CPUs.
func pinnedPod(t testing.TB, ns, name string) (*corev1.Pod, string) {
	t.Helper()
	claimTemplate(t, ns, name, 1)
	create(t, ns, podSpec{name: name, template: name})
	pod := running(t, ns, name)
	p := placement(t, pod, "app")
	granted := grantedCPUs(t, p, podClaim(t, pod))
	if p.CgroupCPUs != granted {
		t.Fatalf("the kernel runs %s on %q, the claim holds %q", name, p.CgroupCPUs, granted)
	}
	return pod, granted
}

// keeps checks that a pod still runs the same container (not restarted) on the same CPUs.
func keeps(t testing.TB, pod *corev1.Pod, granted string) {
	t.Helper()
	c, cancel := cx()
	defer cancel()
	now, err := node.Client.CoreV1().Pods(pod.Namespace).Get(c, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if containerID(t, now, "app") != containerID(t, pod, "app") || now.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("pod %s's container was replaced: %+v", pod.Name, now.Status.ContainerStatuses)
	}
	if got := placement(t, now, "app").CgroupCPUs; got != granted {
		t.Fatalf("pod %s runs on %q now, its claim holds %q", pod.Name, got, granted)
	}
}

// sliceUIDs are the UIDs of the node's ResourceSlices.
func sliceUIDs(t testing.TB) map[types.UID]bool {
	t.Helper()
	c, cancel := cx()
	defer cancel()
	slices, err := node.Client.ResourceV1().ResourceSlices().List(c, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]bool{}
	for _, s := range slices.Items {
		out[s.UID] = true
	}
	return out
}

// A kubelet restart with a claim pod running: the kubelet wipes the driver's ResourceSlices when
// it starts and the agent publishes them again (new objects); the pod is not prepared again and
// keeps its container and its CPUs; a new claim after the restart is prepared.
func TestAKubeletRestartWipesAndRepublishesTheSlicesAndPodsKeepTheirCPUs(t *testing.T) {
	ns := namespace(t)
	pod, granted := pinnedPod(t, ns, "before")
	old := sliceUIDs(t)
	if err := node.Stop("kubelet"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := node.Start("kubelet"); err != nil {
		t.Fatal(err)
	}
	poll(t, "the slices to be wiped and published again", limit, func() (bool, error) {
		now := sliceUIDs(t)
		for uid := range now {
			if old[uid] {
				return false, nil
			}
		}
		return len(now) > 0, nil
	})
	t.Logf("slices republished %s after the kubelet started again", time.Since(began).Round(time.Millisecond))
	keeps(t, pod, granted)
	deletePod(t, ns, "before")
	_, after := pinnedPod(t, ns, "after")
	t.Logf("a claim after the kubelet's restart got %q", after)
}

// The agent's pod deleted (the DaemonSet makes another) and containerd restarted (the agent
// loses its NRI connection, exits, and the kubelet restarts it): the pinned pod keeps its
// container and CPUs through both, and a new claim is prepared afterwards.
func TestAgentPodAndContainerdRestartsKeepPinnedContainersOnTheirCPUs(t *testing.T) {
	ns := namespace(t)
	pod, granted := pinnedPod(t, ns, "pinned")
	agent := agentPod(t)
	c, cancel := cx()
	err := node.Client.CoreV1().Pods(agent.Namespace).Delete(c, agent.Name, metav1.DeleteOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	poll(t, "a new agent pod", limit, func() (bool, error) { return agentPod(t).UID != agent.UID, nil })
	keeps(t, pod, granted)

	restarts := agentPod(t).Status.ContainerStatuses[0].RestartCount
	if err := node.Stop("containerd"); err != nil {
		t.Fatal(err)
	}
	if err := node.Start("containerd"); err != nil {
		t.Fatal(err)
	}
	poll(t, "the agent to be restarted and ready after containerd's restart", limit, func() (bool, error) {
		return agentPod(t).Status.ContainerStatuses[0].RestartCount > restarts, nil
	})
	keeps(t, pod, granted)
	deletePod(t, ns, "pinned")
	_, after := pinnedPod(t, ns, "after")
	t.Logf("a claim after the restarts got %q", after)
}
