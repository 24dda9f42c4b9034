package nodev2scenarios

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
	"github.com/resmgr/resmgr/tests/controlplane/internal/scenariokit"
)

const (
	// deviceClass is the chart's DeviceClass.
	deviceClass = "cpu.resmgr.io"
	// limit bounds each wait for the cluster to react; the node is emulated, several times
	// slower than this machine.
	limit = 5 * time.Minute
)

// kit is the shared helpers (scenariokit) on the package's node: waits of up to limit that look
// every 200 ms; the namespaces stay.
func kit() scenariokit.Kit {
	return scenariokit.Kit{Node: node, Limit: limit, Every: 200 * time.Millisecond}
}

func cx() (context.Context, context.CancelFunc) { return scenariokit.Cx() }

// poll calls cond every 200 ms until it is true or within passes, then fails with its last
// error.
func poll(t testing.TB, what string, within time.Duration, cond func() (bool, error)) {
	t.Helper()
	kit().Poll(t, what, within, cond)
}

// guest runs a shell command in the VM; its output, trimmed.
func guest(t testing.TB, script string) string {
	t.Helper()
	out, err := node.VM().Run(script)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// namespace creates a namespace for one test; its pods are deleted, and waited for, when the
// test ends.
func namespace(t testing.TB) string {
	t.Helper()
	// The test's name, cut to fit and told apart from its siblings' by a hash of the whole.
	full := strings.ToLower(strings.NewReplacer("_", "-", "/", "-", "=", "-").Replace(t.Name()))
	name := full
	if len(name) > 50 {
		name = strings.Trim(name[:40], "-") + fmt.Sprintf("-%08x", crc32.ChecksumIEEE([]byte(full)))
	}
	return kit().Namespace(t, strings.Trim(name, "-"))
}

// claimTemplate creates a ResourceClaimTemplate for one device of the class with capacity,
// on NUMA node numa when it is not empty.
func claimTemplate(t testing.TB, ns, name string, capacity map[string]string, numa string) {
	t.Helper()
	requests := map[resourcev1.QualifiedName]resource.Quantity{}
	for k, v := range capacity {
		requests[resourcev1.QualifiedName(k)] = resource.MustParse(v)
	}
	var selectors []resourcev1.DeviceSelector
	if numa != "" {
		selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: `device.attributes["resource.kubernetes.io"].numaNode == ` + numa}}}
	}
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "cpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: requests}, Selectors: selectors,
			}}},
		}}},
	}
	c, cancel := cx()
	defer cancel()
	if _, err := node.Client.ResourceV1().ResourceClaimTemplates(ns).Create(c, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// sleeper sleeps and exits on SIGTERM, so that a pod stops as soon as the kubelet asks.
var sleeper = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"}

// newPod is a pod of the test image with one container, app, that sleeps; with template, app
// uses the pod's claim "cpus" from it.
func newPod(ns, name, template string, requests, limits corev1.ResourceList) *corev1.Pod {
	grace := int64(1)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{
			Name: "app", Image: os.Getenv(onenode.EnvTestName), ImagePullPolicy: corev1.PullNever, Command: sleeper,
			Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits}}}}}
	if template != "" {
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "cpus", ResourceClaimTemplateName: &template}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "cpus"}}
	}
	return pod
}

// create creates the pod and waits until it runs; the running pod.
func create(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	c, cancel := cx()
	_, err := node.Client.CoreV1().Pods(pod.Namespace).Create(c, pod, metav1.CreateOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	return running(t, pod.Namespace, pod.Name)
}

// running waits until the pod and every container of it run; the pod.
func running(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll(t, "pod "+ns+"/"+name+" to run", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		var err error
		pod, err = node.Client.CoreV1().Pods(ns).Get(c, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pod.Status.Phase != corev1.PodRunning {
			return false, fmt.Errorf("phase %s", pod.Status.Phase)
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.State.Running == nil || !s.Ready {
				return false, fmt.Errorf("container %s not running: %+v", s.Name, s.State)
			}
		}
		return true, nil
	})
	return pod
}

// deletePod deletes a pod and waits until it is gone.
func deletePod(t testing.TB, ns, name string) {
	t.Helper()
	kit().DeletePod(t, ns, name)
}

// containerID is the runtime's ID of the pod's first container (app in the tests' pods).
func containerID(t testing.TB, pod *corev1.Pod) string {
	t.Helper()
	return scenariokit.ContainerID(t, pod, pod.Spec.Containers[0].Name)
}

// cgroupOf reads the cgroup of the pod's first container in the guest; every process of it must
// be allowed exactly what the cgroup allows.
func cgroupOf(t testing.TB, pod *corev1.Pod) onenode.GuestCgroup {
	t.Helper()
	g, err := node.GuestCgroup(containerID(t, pod))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range g.Processes {
		if p.CPUsAllowed != g.Files["cpuset.cpus.effective"] || p.MemsAllowed != g.Files["cpuset.mems.effective"] {
			t.Fatalf("%s: process %d may run on CPUs %q and memory nodes %q, its cgroup %s on %q and %q", pod.Name, p.PID,
				p.CPUsAllowed, p.MemsAllowed, g.Path, g.Files["cpuset.cpus.effective"], g.Files["cpuset.mems.effective"])
		}
	}
	return g
}

// podClaim is the ResourceClaim generated for the pod's claim "cpus".
func podClaim(t testing.TB, pod *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	return kit().PodClaim(t, pod)
}

// cpuset parses a cpuset ("1,3-5") into its sorted members.
func cpuset(t testing.TB, set string) []int {
	t.Helper()
	return scenariokit.CPUs(t, set).Sorted()
}

// minus is a's members not in b, as a cpuset.
func minus(t testing.TB, a, b string) string {
	t.Helper()
	return scenariokit.CPUs(t, a).Minus(scenariokit.CPUs(t, b)).String()
}

// same says whether two cpusets have the same members.
func same(t testing.TB, a, b string) bool {
	t.Helper()
	return scenariokit.CPUs(t, a).Equal(scenariokit.CPUs(t, b))
}

// upgradeAgent upgrades the agent's release with extra values over the node's. They stay: each
// upgrade rolls the agent's pod, minutes on the emulated node, so the tests that change the
// values come last.
func upgradeAgent(t testing.TB, file string, extra map[string]any) {
	t.Helper()
	values, err := node.ValuesFile(file, extra)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values, "--wait", "--timeout", "5m"); err != nil {
		t.Fatal(err)
	}
}
