package clusterscenarios

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
	"github.com/resmgr/resmgr/tests/controlplane/internal/scenariokit"
	"github.com/resmgr/resmgr/tests/gokit/cpulist"
)

const (
	// deviceClass is the chart's DeviceClass.
	deviceClass = "cpu.resmgr.io"
	// driver is the chart's DRA driver name.
	driver = "topology-aware.resmgr.io"
)

// limit bounds each wait for the cluster to react. A prepare the kubelet retries waits for its
// pod resync, seen at 70-75 s here, so this leaves room for that on a loaded machine.
const limit = 3 * time.Minute

// kit is the shared helpers (scenariokit) on the package's node: waits of up to limit that look
// every 100 ms and end with the kubelet's log when they fail, and namespaces that go after their
// tests.
func kit() scenariokit.Kit {
	return scenariokit.Kit{Node: node, Limit: limit, Every: 100 * time.Millisecond, DeleteNamespaces: true,
		Note: func() string { return "\nkubelet log ends:\n" + node.Tail("kubelet", 15) }}
}

func cx() (context.Context, context.CancelFunc) { return scenariokit.Cx() }

// poll calls cond every 100 ms until it is true or limit passes, then fails with its last error.
func poll(t testing.TB, what string, within time.Duration, cond func() (bool, error)) {
	t.Helper()
	kit().Poll(t, what, within, cond)
}

// namespace creates a namespace for one test, named after it, deleted when it ends
// (scenariokit's Kit.Namespace says how).
func namespace(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("_", "-", "/", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	return kit().Namespace(t, strings.Trim(name, "-"))
}

// claimTemplate creates a ResourceClaimTemplate for cpus CPUs of one device of the class.
func claimTemplate(t testing.TB, ns, name string, cpus int) {
	t.Helper()
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "cpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					"cpu": resource.MustParse(strconv.Itoa(cpus))}},
			}}},
		}}},
	}
	c, cancel := cx()
	defer cancel()
	if _, err := node.Client.ResourceV1().ResourceClaimTemplates(ns).Create(c, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// sleeper is the command of the test pods' containers: a shell that sleeps and exits on SIGTERM,
// so that a pod stops as soon as the kubelet asks (the test image's own sleep, PID 1 of its
// namespace, ignores SIGTERM and would be killed only at the end of the grace period). Both
// processes carry the container's environment and cpuset.
var sleeper = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"}

// podSpec is a pod of the test image that sleeps (sleeper), in containers named by names.
type podSpec struct {
	name       string
	containers []string
	// template, or claim: the pod's claim "cpus" from a ResourceClaimTemplate or a ResourceClaim,
	// used by every container.
	template, claim string
	requests        corev1.ResourceList
	limits          corev1.ResourceList
}

func (p podSpec) pod(ns string) *corev1.Pod {
	// A grace period, however short, makes a deletion graceful: the kubelet stops the
	// containers and unprepares the claims before the pod leaves the API, so its CPUs are free on
	// the node before the scheduler can hand them to the next claim. With 0 the pod leaves the API
	// at once and the next claim's prepare can find them still held (the kubelet retries later).
	grace := int64(1)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace}}
	if p.template != "" || p.claim != "" {
		rc := corev1.PodResourceClaim{Name: "cpus"}
		if p.template != "" {
			rc.ResourceClaimTemplateName = &p.template
		} else {
			rc.ResourceClaimName = &p.claim
		}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{rc}
	}
	names := p.containers
	if len(names) == 0 {
		names = []string{"app"}
	}
	for _, name := range names {
		c := corev1.Container{Name: name, Image: os.Getenv(onenode.EnvTestName), ImagePullPolicy: corev1.PullNever,
			Command: sleeper, Resources: corev1.ResourceRequirements{Requests: p.requests, Limits: p.limits}}
		if p.template != "" || p.claim != "" {
			c.Resources.Claims = []corev1.ResourceClaim{{Name: "cpus"}}
		}
		pod.Spec.Containers = append(pod.Spec.Containers, c)
	}
	return pod
}

// create creates the pod.
func create(t testing.TB, ns string, p podSpec) {
	t.Helper()
	c, cancel := cx()
	defer cancel()
	if _, err := node.Client.CoreV1().Pods(ns).Create(c, p.pod(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// running waits until the pod runs and returns it.
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
			return false, fmt.Errorf("phase %s: %s", pod.Status.Phase, describePod(pod))
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.State.Running == nil {
				return false, fmt.Errorf("container %s not running: %s", s.Name, describePod(pod))
			}
		}
		return true, nil
	})
	return pod
}

func describePod(pod *corev1.Pod) string {
	var parts []string
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			parts = append(parts, fmt.Sprintf("%s=%s %s %s", c.Type, c.Status, c.Reason, c.Message))
		}
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Waiting != nil {
			parts = append(parts, fmt.Sprintf("%s waiting: %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message))
		}
	}
	return strings.Join(parts, "; ")
}

// deletePod deletes a pod and waits until it is gone.
func deletePod(t testing.TB, ns, name string) {
	t.Helper()
	kit().DeletePod(t, ns, name)
}

// containerID is the runtime's ID of a pod's container.
func containerID(t testing.TB, pod *corev1.Pod, container string) string {
	t.Helper()
	return scenariokit.ContainerID(t, pod, container)
}

// placement is where the kernel runs a pod's container; every process of it must agree with
// its cgroup.
func placement(t testing.TB, pod *corev1.Pod, container string) onenode.Placement {
	t.Helper()
	p, err := node.Placement(containerID(t, pod, container))
	if err != nil {
		t.Fatal(err)
	}
	for _, proc := range p.Processes {
		if proc.CPUsAllowed != p.CgroupCPUs {
			t.Fatalf("%s/%s: process %d may run on %q, its cgroup %s on %q", pod.Name, container, proc.PID, proc.CPUsAllowed, p.Cgroup, p.CgroupCPUs)
		}
	}
	return p
}

// podClaim is the ResourceClaim the controller made for a pod's claim "cpus", or for its only
// claim (the examples name theirs as they like).
func podClaim(t testing.TB, pod *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	return kit().PodClaim(t, pod)
}

// grantedCPUs is the cpuset the agent granted a claim, as the CDI device put it into the
// container's environment (DRA_CPUSET_<claim UID>).
func grantedCPUs(t testing.TB, p onenode.Placement, claim *resourcev1.ResourceClaim) string {
	t.Helper()
	key := "DRA_CPUSET_" + strings.ReplaceAll(string(claim.UID), "-", "_")
	for _, proc := range p.Processes {
		if v, ok := proc.Env[key]; ok {
			return v
		}
	}
	t.Fatalf("no process of %s has %s in its environment", p.Cgroup, key)
	return ""
}

// cdiSpecs lists the CDI spec files the agent has written.
func cdiSpecs(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(node.CDIDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(node.CDIDir(), e.Name()))
		}
	}
	return out
}

// cpus parses a cpuset ("1,3-5").
func cpus(t testing.TB, set string) cpulist.Set {
	t.Helper()
	return scenariokit.CPUs(t, set)
}

func overlaps(t testing.TB, a, b string) bool {
	t.Helper()
	return cpus(t, a).Overlaps(cpus(t, b))
}
