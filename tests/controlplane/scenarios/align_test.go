package scenarios

import (
	"context"
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

// Alignment with another DRA driver's devices (issue 26): a test publisher plays a GPU driver,
// `gpu.example.com`, publishing GPU-like devices on our node with the standard attributes a
// GPU driver takes from its PCI device, and the real scheduler aligns a claim's GPU with our
// CPUs and memory through `matchAttribute`.

const (
	// gpuDriver is the test publisher's driver, and the name of its DeviceClass (that of
	// kubernetes-sigs/dra-example-driver, which examples/kubernetes names).
	gpuDriver = "gpu.example.com"
	numaAttr  = "resource.kubernetes.io/numaNode"
	pcieAttr  = "resource.kubernetes.io/pcieRoot"
	// alignTopology is twoNUMA with 32 GiB on each node; with claim-memory 80% each device
	// publishes 25.6 GiB.
	alignTopology = "synthetic:pack:1 numa:2(memory=32GiB) core:4 pu:2"
)

// pcieRoots are the fake sysfs's root complexes and their cpulistaffinity: two local to each
// NUMA node of alignTopology, so that each of our devices lists two roots.
var pcieRoots = map[string]string{"0000:00": "0-7", "0000:40": "0-7", "0000:80": "8-15", "0000:c0": "8-15"}

// fakeSysfs writes a sysfs tree with pcieRoots (each root bus's cpulistaffinity, and a device
// on it with the bus's NUMA node) and returns its root, for the agent's --sysfs-root.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for bus, cpus := range pcieRoots {
		dir := filepath.Join(root, "devices", "pci"+bus)
		numa := "0"
		if cpus == "8-15" {
			numa = "1"
		}
		for path, content := range map[string]string{
			filepath.Join(dir, "pci_bus", bus, "cpulistaffinity"): cpus + "\n",
			filepath.Join(dir, bus+":00.0", "numa_node"):          numa + "\n",
		} {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// gpu is one device of the test publisher.
type gpu struct {
	name string
	numa int64
	// roots is its pcieRoot as a list of strings (the DRAListTypeAttributes form); root as a
	// plain string. Neither: no pcieRoot.
	roots []string
	root  string
}

// publishGPUs plays the GPU driver: its DeviceClass, and one ResourceSlice of gpus on our node
// (one pool, named after the node, as kubelet plugins publish).
func publishGPUs(t *testing.T, cp *cluster.Cluster, gpus []gpu) {
	t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: gpuDriver},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", gpuDriver)}}}}}
	if _, err := cp.Admin.ResourceV1().DeviceClasses().Create(cx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating DeviceClass %s: %v", gpuDriver, err)
	}
	var devs []resourcev1.Device
	for _, g := range gpus {
		numa := g.numa
		attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			numaAttr: {IntValue: &numa},
			"model":  {StringValue: ptr("LATEST-GPU-MODEL")},
		}
		switch {
		case len(g.roots) > 0:
			attrs[pcieAttr] = resourcev1.DeviceAttribute{StringValues: g.roots}
		case g.root != "":
			attrs[pcieAttr] = resourcev1.DeviceAttribute{StringValue: ptr(g.root)}
		}
		devs = append(devs, resourcev1.Device{Name: g.name, Attributes: attrs,
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}}})
	}
	name := nodeName
	slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-" + gpuDriver},
		Spec: resourcev1.ResourceSliceSpec{Driver: gpuDriver, NodeName: &name,
			Pool:    resourcev1.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
			Devices: devs}}
	created, err := cp.Admin.ResourceV1().ResourceSlices().Create(cx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("publishing the GPU driver's slice: %v", err)
	}
	// What the API server kept: a list the gate does not allow would be dropped, and the
	// scenario would test something else than it says.
	for i, d := range created.Spec.Devices {
		want := gpus[i]
		got := d.Attributes[pcieAttr]
		if len(got.StringValues) != len(want.roots) || (want.root != "") != (got.StringValue != nil) {
			t.Fatalf("the API server stored GPU %s with pcieRoot %+v, the publisher gave %v / %q", d.Name, got, want.roots, want.root)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// alignedRequest is one request of an aligned claim.
type alignedRequest struct {
	name, class string
	// cpu and memory are capacity requests ("" for none).
	cpu, memory string
}

// createAlignedClaim creates a claim of requests with one matchAttribute constraint on
// attribute over all of them (none when attribute is "").
func (e *env) createAlignedClaim(name, attribute string, requests ...alignedRequest) {
	e.t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloads}}
	for _, r := range requests {
		req := resourcev1.ExactDeviceRequest{DeviceClassName: r.class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}
		caps := map[resourcev1.QualifiedName]resource.Quantity{}
		if r.cpu != "" {
			caps["cpu"] = resource.MustParse(r.cpu)
		}
		if r.memory != "" {
			caps["memory"] = resource.MustParse(r.memory)
		}
		if len(caps) > 0 {
			req.Capacity = &resourcev1.CapacityRequirements{Requests: caps}
		}
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourcev1.DeviceRequest{Name: r.name, Exactly: &req})
	}
	if attribute != "" {
		attr := resourcev1.FullyQualifiedName(attribute)
		claim.Spec.Devices.Constraints = []resourcev1.DeviceConstraint{{MatchAttribute: &attr}}
	}
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	if _, err := e.cp.Admin.ResourceV1().ResourceClaims(workloads).Create(cx, claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating claim %s: %v", name, err)
	}
}

// gpuAndCPUs are the requests of a claim for one GPU and cpu CPUs (and memory) of ours.
func gpuAndCPUs(cpu, memory string) []alignedRequest {
	return []alignedRequest{{name: "gpu", class: gpuDriver}, {name: "cpus", class: deviceClass, cpu: cpu, memory: memory}}
}

// runAligned runs a pod with the claim name (created before), as e.run does: the scheduler
// binds it, the agent prepares our part of the claim and the container starts.
func (e *env) runAligned(name string) *workload {
	e.t.Helper()
	e.createPod(name, podSpec{claim: name})
	w := &workload{pod: e.cp.Scheduled(workloads, name)}
	w.claim = e.cp.Claim(workloads, name)
	prepared, err := e.node.Prepare(e.cp.Admin, w.pod)
	if err != nil {
		e.t.Fatalf("the scheduler allocated %s, and the agent did not prepare it: %v", describe(w.claim), err)
	}
	w.prepared = prepared[name]
	w.app = e.node.RunContainers(w.pod)["app"]
	e.t.Logf("scheduler: %s; agent: %s; container on cpus %q mems %q", describe(w.claim), preparedText(w.prepared), w.app.Cpus, w.app.Mems)
	return w
}

// resultOf is the claim's one result for request, failing the test when there is not one.
func resultOf(t *testing.T, claim *resourcev1.ResourceClaim, request string) resourcev1.DeviceRequestAllocationResult {
	t.Helper()
	var found []resourcev1.DeviceRequestAllocationResult
	for _, r := range results(claim) {
		if r.Request == request {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: want one result for request %s", describe(claim), request)
	}
	return found[0]
}

// checkAligned checks that the scheduler gave the claim wantGPU of the GPU driver and our
// wantNUMA device, consuming cpu (and memory) there, and that the agent granted the container
// that many CPUs of that NUMA node, and its memory.
func checkAligned(t *testing.T, w *workload, wantGPU, wantNUMA string, cpu int, memory string) {
	t.Helper()
	g := resultOf(t, w.claim, "gpu")
	if g.Driver != gpuDriver || g.Device != wantGPU {
		t.Fatalf("%s: the GPU request got %s/%s, want %s/%s", describe(w.claim), g.Driver, g.Device, gpuDriver, wantGPU)
	}
	c := resultOf(t, w.claim, "cpus")
	if c.Driver != node.Driver || c.Device != wantNUMA {
		t.Fatalf("%s: the cpus request got %s/%s, want %s/%s (the GPU's NUMA node)", describe(w.claim), c.Driver, c.Device, node.Driver, wantNUMA)
	}
	if got := c.ConsumedCapacity["cpu"]; got.Value() != int64(cpu) {
		t.Fatalf("%s: the scheduler consumed %s cpu, want %d", describe(w.claim), got.String(), cpu)
	}
	if memory != "" {
		if got := c.ConsumedCapacity["memory"]; got.Cmp(resource.MustParse(memory)) != 0 {
			t.Fatalf("%s: the scheduler consumed %s memory, want %s", describe(w.claim), got.String(), memory)
		}
	}
	// The agent answered for its own result only; the GPU is the other driver's to prepare.
	if len(w.prepared) != 1 || w.prepared[0].Device != wantNUMA {
		t.Fatalf("%s: the agent prepared %s", describe(w.claim), preparedText(w.prepared))
	}
	granted := claimCPUs(w)
	if len(cpus(granted)) != cpu || !subset(granted, numaCPUs[wantNUMA]) || w.app.Cpus != granted {
		t.Fatalf("%s: the agent granted %q and the container runs on %q, want %d cpus of %s (%s)",
			describe(w.claim), granted, w.app.Cpus, cpu, wantNUMA, numaCPUs[wantNUMA])
	}
	if want := strings.TrimPrefix(wantNUMA, "numa"); w.app.Mems != want {
		t.Fatalf("%s: the container's memory nodes are %q, want %s", describe(w.claim), w.app.Mems, want)
	}
}

// ourAttributes waits for our two NUMA devices and returns their attributes by device name.
func (e *env) ourAttributes() map[string]map[resourcev1.QualifiedName]resourcev1.DeviceAttribute {
	e.t.Helper()
	devs := devices(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) == 2 }))
	out := map[string]map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
	for name, d := range devs {
		out[name] = d.Attributes
	}
	return out
}

// With DRAListTypeAttributes off (its default, on 1.36 and 1.37 alike) and expose-pcie-roots on:
// the API server refuses our pcieRoot list, and the agent publishes its devices without it and
// reports the dropped field. A GPU driver's GPUs, both on NUMA node 1 (the node the scheduler
// does not pick first: numa0 comes first in our slice), and a claim for a GPU, CPUs and memory
// with `matchAttribute: resource.kubernetes.io/numaNode` over all its requests: the scheduler
// puts all of it on NUMA node 1. One that numa1 has too few CPUs left for stays Pending with
// the scheduler's reason, although the same claim without the constraint is allocated (a GPU on
// NUMA 1, CPUs on NUMA 0). The example claim examples/kubernetes/claim-gpu-cpus-memory-one-
// numa-node.yaml, applied as it is, lands on NUMA node 1 too.
func TestAlignsWithAnotherDriversGPUByNUMANode(t *testing.T) {
	e := start(t, options{topology: alignTopology,
		args: []string{"--claim-memory", "80%", "--expose-pcie-roots=true", "--sysfs-root", fakeSysfs(t)}})

	e.cp.Poll("the agent reporting the dropped pcieRoot list", func(context.Context) (bool, error) {
		for _, line := range strings.Split(e.node.Metrics(), "\n") {
			if strings.HasPrefix(line, "resmgr_slice_fields_dropped{") && strings.Contains(line, pcieAttr) &&
				strings.HasSuffix(line, " 1") {
				return true, nil
			}
		}
		return false, nil
	})
	if log := e.node.Log(); !strings.Contains(log, "refuses list-valued device attributes") || !strings.Contains(log, "DRAListTypeAttributes") {
		t.Fatalf("the agent's log does not name the refused lists and the gate:\n%s", log)
	}
	for name, attrs := range e.ourAttributes() {
		numa := attrs[numaAttr]
		if _, has := attrs[pcieAttr]; has || numa.IntValue == nil || fmt.Sprintf("numa%d", *numa.IntValue) != name {
			t.Fatalf("device %s is published with numaNode %+v and pcieRoot %+v; want its node and no pcieRoot",
				name, numa, attrs[pcieAttr])
		}
	}

	publishGPUs(t, e.cp, []gpu{{name: "gpu-0", numa: 1}, {name: "gpu-1", numa: 1}, {name: "gpu-2", numa: 1}})

	e.createAlignedClaim("aligned", numaAttr, gpuAndCPUs("4", "4Gi")...)
	aligned := e.runAligned("aligned")
	checkAligned(t, aligned, "gpu-0", "numa1", 4, "4Gi")

	// numa1 has 4 CPUs left, numa0 7: 6 CPUs fit only away from the GPUs.
	e.createAlignedClaim("unaligned", numaAttr, gpuAndCPUs("6", "")...)
	e.createPod("unaligned", podSpec{claim: "unaligned"})
	msg := e.cp.Unschedulable(workloads, "unaligned")
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Fatalf("the unaligned claim's pod is unschedulable for another reason: %s", msg)
	}
	if pod := e.pod("unaligned"); pod.Status.Phase != corev1.PodPending {
		t.Fatalf("the unaligned claim's pod is %s, want Pending", pod.Status.Phase)
	}
	if c := e.cp.Claim(workloads, "unaligned"); c.Status.Allocation != nil {
		t.Fatalf("the unaligned claim is allocated: %s", describe(c))
	}
	e.createAlignedClaim("unconstrained", "", gpuAndCPUs("6", "")...)
	unconstrained := e.runAligned("unconstrained")
	if c := resultOf(t, unconstrained.claim, "cpus"); c.Device != "numa0" {
		t.Fatalf("%s: without the constraint, want the 6 CPUs on numa0", describe(unconstrained.claim))
	}

	// The example, as users apply it: 4 CPUs and 16 GiB on the GPU's node (numa1 has 4 CPUs and
	// 21.6 GiB left), from a claim template.
	e.cp.Kubectl("apply", "-f", filepath.Join(repoRoot(t), "examples", "kubernetes", "claim-gpu-cpus-memory-one-numa-node.yaml"))
	pod := e.cp.Scheduled(workloads, "dra-gpu-numa-aligned")
	var claimName string
	e.cp.Poll("the example pod's claim made from its template", func(cx context.Context) (bool, error) {
		p, err := e.cp.Admin.CoreV1().Pods(workloads).Get(cx, pod.Name, metav1.GetOptions{})
		if err != nil || len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return false, err
		}
		claimName = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
		return true, nil
	})
	example := e.cp.Claim(workloads, claimName)
	g, numa := resultOf(t, example, "gpu"), resultOf(t, example, "numa")
	if g.Driver != gpuDriver || numa.Driver != node.Driver || numa.Device != "numa1" {
		t.Fatalf("the example's %s: want a GPU and numa1, the GPUs' node", describe(example))
	}
	if cpu, mem := numa.ConsumedCapacity["cpu"], numa.ConsumedCapacity["memory"]; cpu.Value() != 4 || mem.Cmp(resource.MustParse("16Gi")) != 0 {
		t.Fatalf("the example's %s: want 4 cpu and 16Gi consumed", describe(example))
	}
	t.Logf("the example: %s", describe(example))
}

// pod reads a pod of the workloads' namespace.
func (e *env) pod(name string) *corev1.Pod {
	e.t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	p, err := e.cp.Admin.CoreV1().Pods(workloads).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("reading pod %s: %v", name, err)
	}
	return p
}

// With DRAListTypeAttributes on the API server and the scheduler, and expose-pcie-roots: each
// of our devices lists the two PCIe roots local to its CPUs, and `matchAttribute:
// resource.kubernetes.io/pcieRoot` aligns our CPUs with a GPU on one of them, whether the GPU
// lists its root (a one-element list: a whole-list comparison would refuse it, the scheduler
// intersects) or publishes it as a plain string (a one-element set to the scheduler). That is
// 1.37's scheduler; 1.36's accepts the gate and the lists but matches no list (see below).
func TestAlignsWithAnotherDriversGPUByPCIeRoot(t *testing.T) {
	e := start(t, options{gates: cluster.Gates{"DRAListTypeAttributes": true}, topology: alignTopology,
		args: []string{"--expose-pcie-roots=true", "--sysfs-root", fakeSysfs(t)}})

	want := map[string][]string{"numa0": {"pci0000:00", "pci0000:40"}, "numa1": {"pci0000:80", "pci0000:c0"}}
	for name, attrs := range e.ourAttributes() {
		if got := attrs[pcieAttr].StringValues; strings.Join(got, ",") != strings.Join(want[name], ",") {
			t.Fatalf("device %s is published with pcieRoot %+v, want the list %v", name, attrs[pcieAttr], want[name])
		}
	}
	if m := e.node.Metrics(); strings.Contains(m, "resmgr_slice_fields_dropped{") {
		t.Fatalf("with the gate on the agent reports dropped fields:\n%s", m)
	}

	// Neither GPU says its NUMA node differently from its root, but the claims match on the
	// root alone.
	publishGPUs(t, e.cp, []gpu{{name: "gpu-0", numa: 1, roots: []string{"pci0000:c0"}}, {name: "gpu-1", numa: 1, root: "pci0000:80"}})

	e.createAlignedClaim("listed-root", pcieAttr, gpuAndCPUs("4", "")...)
	e.createAlignedClaim("string-root", pcieAttr, gpuAndCPUs("2", "")...)
	if serverMinor(t, e) < 37 {
		// 1.36's kube-scheduler does not hand the gate to its allocator
		// (dynamicresources.AllocatorFeatures leaves ListTypeAttributes out), which then
		// compares scalars only: a list matches nothing, not even itself.
		for _, name := range []string{"listed-root", "string-root"} {
			e.createPod(name, podSpec{claim: name})
			if msg := e.cp.Unschedulable(workloads, name); !strings.Contains(msg, "cannot allocate all claims") {
				t.Fatalf("claim %s on 1.36 is unschedulable for another reason: %s", name, msg)
			}
		}
		return
	}
	listed := e.runAligned("listed-root")
	checkAligned(t, listed, "gpu-0", "numa1", 4, "")
	plain := e.runAligned("string-root")
	checkAligned(t, plain, "gpu-1", "numa1", 2, "")
}
