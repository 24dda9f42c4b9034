// Package scenarios runs resmgr's agent against a real kube-apiserver, kube-scheduler and
// kube-controller-manager: the agent publishes its devices with its own RBAC and admission
// policy from our manifests, with a token bound to the pod the DaemonSet controller made for its
// node; the real scheduler allocates claims for pods the tests create from those slices alone;
// the tests prepare what it allocated through the agent's real DRA socket and run the pods'
// containers through the runtime's NRI side; the real resource claim controller releases the
// claims when the pods go. Each test has a control plane of its own.
//
// The kubelet is played here (package node), and stays so: every scenario needs a node that is
// not the machine running the tests (16 CPUs in two NUMA nodes of cores with two threads, or a
// 2-CPU node on any machine), a device model, agent flags or API server feature gates of its own,
// switched in seconds, and checks what the scheduler allocated against what the agent granted. A
// real kubelet runs real containers on the machine's own CPUs and cannot stand for such a node.
// What a real kubelet and controller-manager can show, the cluster stage shows with nothing
// played (package clusterscenarios: claims from templates pinned in the kernel, unprepare when a
// pod goes, the kubelet's slice wipe at its start, the admission policy against the agent's
// token, restarts), and the scenarios it covers are not repeated here.
package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

const (
	// agentNamespace and agentAccount are the chart's (deploy/manifests/resmgr.yaml).
	agentNamespace = "resmgr-system"
	agentAccount   = "resmgr"
	deviceClass    = "cpu.resmgr.io"
	// nodeName is the worker node the agent runs on.
	nodeName = "worker-a"
	// workloads is the namespace of the tests' pods.
	workloads = "default"
	// twoNUMA is 2 NUMA nodes of 4 cores with 2 threads: 16 CPUs, 0-7 and 8-15.
	twoNUMA = "synthetic:pack:1 numa:2 core:4 pu:2"
)

// options of one scenario's cluster and agent.
type options struct {
	gates    cluster.Gates
	topology string
	reserved string
	// nodeCPU is the Node's allocatable cpu, as the kubelet would report it.
	nodeCPU string
	args    []string
}

// env is one scenario's cluster: the control plane and the agent's node.
type env struct {
	t    *testing.T
	cp   *cluster.Cluster
	node *node.Node
	// lastSlices are our node's slices as last read, shown when the test fails.
	lastSlices []resourcev1.ResourceSlice
}

// repoRoot is the repository, found upwards from the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "deploy", "manifests", "resmgr.yaml")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("deploy/manifests/resmgr.yaml not found above the test's directory")
		}
		dir = parent
	}
}

// install starts the control plane and installs our plain manifests in it (namespace,
// ServiceAccount, RBAC, DeviceClass, admission policy, DaemonSet) with the built kubectl.
func install(t *testing.T, gates cluster.Gates) *cluster.Cluster {
	t.Helper()
	cp := cluster.Start(t, gates)
	cp.Kubectl("apply", "-f", filepath.Join(repoRoot(t), "deploy", "manifests", "resmgr.yaml"))
	cp.Namespace(workloads)
	return cp
}

// agentPodOn waits for the pod the DaemonSet controller makes for node from the chart's
// DaemonSet, once the scheduler has bound it there. No kubelet runs it: the agent runs as a
// process with a token bound to it.
func agentPodOn(t *testing.T, cp *cluster.Cluster, node string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	cp.Poll("the DaemonSet's pod on node "+node, func(cx context.Context) (bool, error) {
		pods, err := cp.Admin.CoreV1().Pods(agentNamespace).List(cx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=resmgr", FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err
		}
		if len(pods.Items) == 1 {
			pod = &pods.Items[0]
		}
		return pod != nil, nil
	})
	return pod
}

// agentToken is a token of the agent's ServiceAccount bound to its pod, as the kubelet
// projects it: it carries the node-name claim the admission policy reads.
func agentToken(cp *cluster.Cluster, pod string) string {
	return strings.TrimSpace(cp.Kubectl("create", "token", agentAccount, "-n", agentNamespace,
		"--bound-object-kind", "Pod", "--bound-object-name", pod, "--duration", "1h"))
}

// start brings up a scenario: control plane, manifests, the Node, the agent's pod and token,
// the agent, and waits until the agent's slices are in the API server.
func start(t *testing.T, o options) *env {
	t.Helper()
	if o.topology == "" {
		o.topology = twoNUMA
	}
	if o.reserved == "" {
		o.reserved = "cpuset:0"
	}
	if o.nodeCPU == "" {
		o.nodeCPU = "16"
	}
	cp := install(t, o.gates)
	cp.Node(nodeName, o.nodeCPU, "64Gi")
	pod := agentPodOn(t, cp, nodeName)
	kubeconfig := cp.TokenKubeconfig("agent.kubeconfig", agentToken(cp, pod.Name))
	n := node.Start(t, node.Config{Name: nodeName, Kubeconfig: kubeconfig, Topology: o.topology,
		Reserved: o.reserved, Args: o.args})
	e := &env{t: t, cp: cp, node: n}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("our node's slices as last read: %s", sliceText(e.lastSlices))
		}
	})
	e.slices(func(s []resourcev1.ResourceSlice) bool { return len(s) > 0 })
	return e
}

// slices waits until our node's slices satisfy cond and returns them.
func (e *env) slices(cond func([]resourcev1.ResourceSlice) bool) []resourcev1.ResourceSlice {
	e.t.Helper()
	var got []resourcev1.ResourceSlice
	e.cp.Poll("our node's resource slices", func(cx context.Context) (bool, error) {
		e.node.Alive()
		list, err := e.cp.Admin.ResourceV1().ResourceSlices().List(cx, metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + nodeName + ",spec.driver=" + node.Driver})
		if err != nil {
			return false, err
		}
		got = list.Items
		e.lastSlices = got
		return cond(got), nil
	})
	return got
}

func sliceText(slices []resourcev1.ResourceSlice) string {
	if len(slices) == 0 {
		return "none"
	}
	data, _ := json.Marshal(slices)
	return string(data)
}

// devices is every device of the slices, by name.
func devices(slices []resourcev1.ResourceSlice) map[string]resourcev1.Device {
	out := map[string]resourcev1.Device{}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

// claimSpec is what a workload asks for.
type claimSpec struct {
	// cpu is the capacity request ("" asks for none: the request policy's default applies).
	cpu string
	// count and matchNUMA ask for individual devices on one NUMA node.
	count     int64
	matchNUMA bool
	class     string
}

// createClaim creates a ResourceClaim with one request "cpus" of our DeviceClass.
func (e *env) createClaim(name string, s claimSpec) *resourcev1.ResourceClaim {
	e.t.Helper()
	class := s.class
	if class == "" {
		class = deviceClass
	}
	req := resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}
	if s.count > 0 {
		req.Count = s.count
	}
	if s.cpu != "" {
		req.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
			"cpu": resource.MustParse(s.cpu)}}
	}
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloads},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "cpus", Exactly: &req}}}},
	}
	if s.matchNUMA {
		attr := resourcev1.FullyQualifiedName("resource.kubernetes.io/numaNode")
		claim.Spec.Devices.Constraints = []resourcev1.DeviceConstraint{{Requests: []string{"cpus"}, MatchAttribute: &attr}}
	}
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	created, err := e.cp.Admin.ResourceV1().ResourceClaims(workloads).Create(cx, claim, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating claim %s: %v", name, err)
	}
	return created
}

// podSpec is a workload pod: one container, with a claim or not.
type podSpec struct {
	claim string
	// cpu is the container's cpu request and limit ("" for none); memory goes with it, so a
	// pod with cpu is Guaranteed.
	cpu string
}

// createPod creates a pod of one container "app" for the scheduler.
func (e *env) createPod(name string, s podSpec) *corev1.Pod {
	e.t.Helper()
	c := corev1.Container{Name: "app", Image: "registry.invalid/busybox"}
	if s.cpu != "" {
		r := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(s.cpu), corev1.ResourceMemory: resource.MustParse("64Mi")}
		c.Resources.Requests, c.Resources.Limits = r, r
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloads},
		Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
	if s.claim != "" {
		claim := s.claim
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "cpus", ResourceClaimName: &claim}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "cpus"}}
	}
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	created, err := e.cp.Admin.CoreV1().Pods(workloads).Create(cx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

// workload is a pod that the scheduler placed and the node started.
type workload struct {
	pod   *corev1.Pod
	claim *resourcev1.ResourceClaim
	// prepared is what the agent answered for the pod's claim.
	prepared []node.PreparedDevice
	// app is the container as the runtime created it.
	app node.Container
}

// run creates a pod (and its claim), waits for the scheduler to bind it, prepares its claim
// through the DRA socket and creates its container; it fails the test if the agent refuses
// anything the scheduler allocated.
func (e *env) run(name string, claim *claimSpec, cpu string) *workload {
	e.t.Helper()
	w := &workload{}
	spec := podSpec{cpu: cpu}
	if claim != nil {
		e.createClaim(name, *claim)
		spec.claim = name
	}
	e.createPod(name, spec)
	w.pod = e.cp.Scheduled(workloads, name)
	if w.pod.Spec.NodeName != nodeName {
		e.t.Fatalf("pod %s bound to %q, want %s", name, w.pod.Spec.NodeName, nodeName)
	}
	if claim != nil {
		w.claim = e.cp.Claim(workloads, name)
		prepared, err := e.node.Prepare(e.cp.Admin, w.pod)
		if err != nil {
			e.t.Fatalf("the scheduler allocated %s, and the agent did not prepare it: %v", describe(w.claim), err)
		}
		w.prepared = prepared[name]
	}
	w.app = e.node.RunContainers(w.pod)["app"]
	if claim != nil {
		e.t.Logf("scheduler: %s; agent: %s; container %s on cpus %q mems %q", describe(w.claim), preparedText(w.prepared),
			name, w.app.Cpus, w.app.Mems)
	} else {
		e.t.Logf("scheduler: pod %s (cpu %q, no claim) on %s; container on cpus %q", name, cpu, w.pod.Spec.NodeName, w.app.Cpus)
	}
	return w
}

func preparedText(devs []node.PreparedDevice) string {
	var parts []string
	for _, d := range devs {
		parts = append(parts, fmt.Sprintf("prepared %s/%s share %q cdi %v", d.Pool, d.Device, d.ShareID, d.CDI))
	}
	return strings.Join(parts, ", ")
}

// remove plays the kubelet when a pod goes (containers removed, claims unprepared) and deletes
// the pod; the resource claim controller deallocates its claims.
func (e *env) remove(w *workload) {
	e.t.Helper()
	e.node.Unprepare(e.cp.Admin, w.pod)
	e.cp.DeletePod(w.pod)
}

// results is the claim's allocation results.
func results(claim *resourcev1.ResourceClaim) []resourcev1.DeviceRequestAllocationResult {
	if claim.Status.Allocation == nil {
		return nil
	}
	return claim.Status.Allocation.Devices.Results
}

// describe prints a claim's allocation for messages.
func describe(claim *resourcev1.ResourceClaim) string {
	var parts []string
	for _, r := range results(claim) {
		consumed, _ := json.Marshal(r.ConsumedCapacity)
		share := ""
		if r.ShareID != nil {
			share = string(*r.ShareID)
		}
		parts = append(parts, fmt.Sprintf("%s/%s (request %s, consumed %s, share %s)", r.Pool, r.Device, r.Request, consumed, share))
	}
	return fmt.Sprintf("claim %s: %s", claim.Name, strings.Join(parts, ", "))
}

// envValue is the value of name in env ("" when absent).
func envValue(env []string, name string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, name+"="); ok {
			return v
		}
	}
	return ""
}

// claimCPUs is the cpuset the claim's CDI spec gave its container.
func claimCPUs(w *workload) string {
	return envValue(w.app.Env, "DRA_CPUSET_"+string(w.claim.UID))
}
