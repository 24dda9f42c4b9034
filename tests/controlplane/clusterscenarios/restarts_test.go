package clusterscenarios

import (
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
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

// keepsContainer checks that a pod still runs the same container, not restarted, and returns
// the pod as it is now.
func keepsContainer(t testing.TB, pod *corev1.Pod) *corev1.Pod {
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
	return now
}

// keeps checks that a pod still runs the same container (not restarted) on the same CPUs.
func keeps(t testing.TB, pod *corev1.Pod, granted string) {
	t.Helper()
	now := keepsContainer(t, pod)
	if got := placement(t, now, "app").CgroupCPUs; got != granted {
		t.Fatalf("pod %s runs on %q now, its claim holds %q", pod.Name, got, granted)
	}
}

// slicesWhere are the cluster's ResourceSlices that match a field selector ("" for all).
func slicesWhere(t testing.TB, fields string) []resourcev1.ResourceSlice {
	t.Helper()
	c, cancel := cx()
	defer cancel()
	slices, err := node.Client.ResourceV1().ResourceSlices().List(c, metav1.ListOptions{FieldSelector: fields})
	if err != nil {
		t.Fatal(err)
	}
	return slices.Items
}

// nodeSlices are the agent's ResourceSlices of the node.
func nodeSlices(t testing.TB) []resourcev1.ResourceSlice {
	t.Helper()
	return slicesWhere(t, "spec.nodeName="+onenode.NodeName+",spec.driver="+driver)
}

// sliceUIDs are the UIDs of the cluster's ResourceSlices.
func sliceUIDs(t testing.TB) map[types.UID]bool {
	t.Helper()
	out := map[types.UID]bool{}
	for _, s := range slicesWhere(t, "") {
		out[s.UID] = true
	}
	return out
}

// publishedDevices are the devices of the slices, as JSON sorted by name, to compare.
func publishedDevices(t testing.TB, slices []resourcev1.ResourceSlice) string {
	t.Helper()
	var devs []resourcev1.Device
	for _, s := range slices {
		devs = append(devs, s.Spec.Devices...)
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Name < devs[j].Name })
	data, err := json.Marshal(devs)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A kubelet restart with a claim pod running: the kubelet wipes the driver's ResourceSlices when
// it starts and the agent publishes them again (new objects, the same devices); the pod is not
// prepared again and keeps its container and its CPUs; a new claim after the restart is
// allocated from the new slices and prepared.
func TestAKubeletRestartWipesAndRepublishesTheSlicesAndPodsKeepTheirCPUs(t *testing.T) {
	ns := namespace(t)
	pod, granted := pinnedPod(t, ns, "before")
	before := nodeSlices(t)
	old := sliceUIDs(t)
	if err := node.Stop("kubelet"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := node.Start("kubelet"); err != nil {
		t.Fatal(err)
	}
	was := publishedDevices(t, before)
	poll(t, "the slices to be wiped and the same devices published again", limit, func() (bool, error) {
		now := nodeSlices(t)
		for _, s := range now {
			if old[s.UID] {
				return false, nil
			}
		}
		if devs := publishedDevices(t, now); len(now) == 0 || devs != was {
			return false, fmt.Errorf("devices before the restart %s, now %s", was, devs)
		}
		return true, nil
	})
	t.Logf("slices republished %s after the kubelet started again", time.Since(began).Round(time.Millisecond))
	keeps(t, pod, granted)
	deletePod(t, ns, "before")
	_, after := pinnedPod(t, ns, "after")
	t.Logf("a claim after the kubelet's restart got %q", after)
}

// The agent's pod deleted (the DaemonSet makes another) and the container runtime restarted
// (the agent loses its NRI connection, exits, and the kubelet restarts it): the pinned pod keeps
// its container and CPUs through both, and a new claim is prepared afterwards. (CRI-O restarted
// reports each container with the cpuset it was created with; the restarted agent's
// Synchronize sets them again, docs/deploy.md: the kernel's cpusets never change.)
func TestAgentPodAndRuntimeRestartsKeepPinnedContainersOnTheirCPUs(t *testing.T) {
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
	if err := node.Stop(onenode.RuntimeDaemon); err != nil {
		t.Fatal(err)
	}
	if err := node.Start(onenode.RuntimeDaemon); err != nil {
		t.Fatal(err)
	}
	poll(t, "the agent to be restarted and ready after the runtime's restart", limit, func() (bool, error) {
		return agentPod(t).Status.ContainerStatuses[0].RestartCount > restarts, nil
	})
	keeps(t, pod, granted)
	deletePod(t, ns, "pinned")
	_, after := pinnedPod(t, ns, "after")
	t.Logf("a claim after the restarts got %q", after)
}
