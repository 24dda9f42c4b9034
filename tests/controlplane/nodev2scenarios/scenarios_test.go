package nodev2scenarios

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// The node is what the package says: cgroup v2 alone, and pods' cgroups made by systemd (the
// kubelet's kubepods.slice is a unit, the agent's container a scope of the runtime's).
func TestTheNodeRunsCgroupV2AloneAndTheSystemdDriver(t *testing.T) {
	if fs := guest(t, "stat -fc %T /sys/fs/cgroup"); fs != "cgroup2fs" {
		t.Fatalf("/sys/fs/cgroup is %s, want cgroup2fs", fs)
	}
	if v1 := guest(t, "grep -c ' cgroup ' /proc/self/mounts || true"); v1 != "0" {
		t.Fatalf("%s cgroup v1 hierarchies are mounted", v1)
	}
	if state := guest(t, "systemctl show -p ActiveState --value kubepods.slice"); state != "active" {
		t.Fatalf("kubepods.slice is %q: the kubelet's systemd driver did not make it", state)
	}
	c, cancel := cx()
	pods, err := node.Client.CoreV1().Pods(onenode.Namespace).List(c, metav1.ListOptions{})
	cancel()
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the agent's pods: %v (%v)", pods, err)
	}
	g := cgroupOf(t, &pods.Items[0])
	if state := guest(t, "systemctl show -p ActiveState --value "+g.Unit); state != "active" {
		t.Fatalf("the agent's container's scope %s is %q in systemd", g.Unit, state)
	}
	t.Logf("the agent's container: %s (%s)", g.Path, g.Unit)
}

// What the daemon-reload checks below rely on, shown on this node's systemd: a cpuset written
// only into cgroupfs is reverted by `systemctl daemon-reload`, one set as the unit's property
// (what runc's systemd driver does) is kept. Without the first, those checks could not fail.
func TestADaemonReloadRevertsACpusetWrittenOnlyInCgroupfs(t *testing.T) {
	out := guest(t, `set -e
systemd-run --quiet --unit=resmgr-premise --slice=resmgrpremise.slice -p AllowedCPUs=1-2 sleep 600
trap 'systemctl stop resmgr-premise' EXIT
d=/sys/fs/cgroup$(systemctl show -p ControlGroup --value resmgr-premise.service)
echo 4 > $d/cpuset.cpus
systemctl daemon-reload
echo "cgroupfs-only $(cat $d/cpuset.cpus.effective)"
systemctl set-property --runtime resmgr-premise AllowedCPUs=5
systemctl daemon-reload
echo "property $(cat $d/cpuset.cpus.effective)"`)
	if want := "cgroupfs-only 1-2\nproperty 5"; out != want {
		t.Fatalf("a cpuset written in cgroupfs and then as systemd's property, each followed by a daemon-reload:\n%s\nwant:\n%s", out, want)
	}
}

// A claim pod pinned to exactly its CPUs, a BestEffort and a Burstable pod beside it on the
// shared pools (one per NUMA node: each pod on the pool the agent chose for it), the
// BestEffort pod's pool shrinking around a claim on its NUMA node and growing back when the
// claim goes; after each move, `systemctl daemon-reload` (systemd applying every unit's
// properties again) leaves every container where the agent put it, and systemd holds for each
// container's scope the cpuset the kernel has (AllowedCPUs), so that nothing systemd does to
// the scopes later (a reload, a restart of their slice) can undo the agent's updates.
func TestClaimsPinAndTheSharedPoolMovesAndADaemonReloadKeepsBoth(t *testing.T) {
	ns := namespace(t)
	be := create(t, newPod(ns, "besteffort", "", nil, nil))
	burstable := create(t, newPod(ns, "burstable", "", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}, nil))
	before := map[string]string{}
	for _, pod := range []*corev1.Pod{be, burstable} {
		g := cgroupOf(t, pod)
		before[pod.Name] = g.Files["cpuset.cpus.effective"]
		if strings.Contains(","+minus(t, before[pod.Name], "")+",", ","+onenode.ReservedCPUs+",") {
			t.Fatalf("%s runs on %q, which includes the reserved CPU %s", pod.Name, before[pod.Name], onenode.ReservedCPUs)
		}
		t.Logf("%s runs on CPUs %s, memory node %s", pod.Name, before[pod.Name], g.Files["cpuset.mems.effective"])
	}
	// The claim is on the BestEffort pod's NUMA node, whose shared pool it takes a CPU of.
	numa := cgroupOf(t, be).Files["cpuset.mems.effective"]
	claimTemplate(t, ns, "one-cpu", map[string]string{"cpu": "1"}, numa)

	// checkAll reads every container in the kernel and in systemd and checks where it runs.
	checkAll := func(when string, pinned *corev1.Pod, claimed string) {
		t.Helper()
		if pinned != nil {
			g := cgroupOf(t, pinned)
			if got := g.Files["cpuset.cpus.effective"]; !same(t, got, claimed) {
				t.Errorf("%s: the claim pod runs on %q, its claim holds %q", when, got, claimed)
			}
			if !same(t, g.Systemd["AllowedCPUs"], claimed) {
				t.Errorf("%s: systemd holds AllowedCPUs=%q for the claim pod's scope %s, the agent granted %q", when, g.Systemd["AllowedCPUs"], g.Unit, claimed)
			}
		}
		for _, pod := range []*corev1.Pod{be, burstable} {
			want := minus(t, before[pod.Name], claimed)
			g := cgroupOf(t, pod)
			if got := g.Files["cpuset.cpus.effective"]; !same(t, got, want) {
				t.Errorf("%s: %s runs on %q, want %q", when, pod.Name, got, want)
			}
			if !same(t, g.Systemd["AllowedCPUs"], want) {
				t.Errorf("%s: systemd holds AllowedCPUs=%q for %s's scope %s, the kernel should have %q", when, g.Systemd["AllowedCPUs"], pod.Name, g.Unit, want)
			}
		}
	}

	pinned := create(t, newPod(ns, "pinned", "one-cpu", nil, nil))
	claimed := cgroupOf(t, pinned).Files["cpuset.cpus.effective"]
	if n := len(cpuset(t, claimed)); n != 1 {
		t.Fatalf("the claim pod runs on %q, its claim is for one CPU", claimed)
	}
	if minus(t, claimed, before[be.Name]) != "" {
		t.Fatalf("the claim's CPU %s is not of the BestEffort pod's pool %s, on whose NUMA node %s it was claimed", claimed, before[be.Name], numa)
	}
	// The pool shrank: the agent's updates reach the running containers.
	poll(t, "the BestEffort pod's pool to shrink around the claim", limit, func() (bool, error) {
		got := cgroupOf(t, be).Files["cpuset.cpus.effective"]
		return same(t, got, minus(t, before[be.Name], claimed)), fmt.Errorf("BestEffort on %q", got)
	})
	checkAll("after pinning", pinned, claimed)
	guest(t, "systemctl daemon-reload")
	checkAll("after pinning and a daemon-reload", pinned, claimed)

	deletePod(t, ns, "pinned")
	poll(t, "the BestEffort pod's pool to grow back", limit, func() (bool, error) {
		got := cgroupOf(t, be).Files["cpuset.cpus.effective"]
		return same(t, got, before[be.Name]), fmt.Errorf("BestEffort on %q", got)
	})
	checkAll("after the claim went", nil, "")
	guest(t, "systemctl daemon-reload")
	checkAll("after the claim went and a daemon-reload", nil, "")
}

// A real reboot with a claim prepared and its pod running: the agent's state directory is on
// the disk and survives, /var/run/cdi is a tmpfs and comes back empty; the kubelet starts the
// pod's containers again, the agent prepares the claim again from its state, on the same CPU,
// and holds nothing stale: one spec, for the one claim, written in this boot.
func TestARebootKeepsTheClaimAndTheAgentPreparesItAgain(t *testing.T) {
	ns := namespace(t)
	be := create(t, newPod(ns, "besteffort", "", nil, nil))
	claimTemplate(t, ns, "one-cpu", map[string]string{"cpu": "1"}, cgroupOf(t, be).Files["cpuset.mems.effective"])
	pinned := create(t, newPod(ns, "pinned", "one-cpu", nil, nil))
	claim := podClaim(t, pinned)
	claimed := cgroupOf(t, pinned).Files["cpuset.cpus.effective"]
	state := "/var/lib/resmgr-node/agent-state"
	if out := guest(t, "grep -rl "+string(claim.UID)+" "+state+" | wc -l"); out == "0" {
		t.Fatalf("the agent's state in %s does not name claim %s", state, claim.UID)
	}
	if n := guest(t, "ls /var/run/cdi | grep -c "+string(claim.UID)[:8]+" || true"); n != "1" {
		t.Fatalf("%s CDI specs in /var/run/cdi for claim %s before the reboot, want 1", n, claim.UID)
	}
	restarts := pinned.Status.ContainerStatuses[0].RestartCount

	if err := node.VM().Reboot(); err != nil {
		t.Fatal(err)
	}
	poll(t, "the pod's container to run again after the reboot", limit, func() (bool, error) {
		pod := running(t, ns, "pinned")
		s := pod.Status.ContainerStatuses[0]
		return s.RestartCount > restarts, fmt.Errorf("restart count %d", s.RestartCount)
	})
	pinned = running(t, ns, "pinned")
	be = running(t, ns, "besteffort")
	if got := cgroupOf(t, pinned).Files["cpuset.cpus.effective"]; !same(t, got, claimed) {
		t.Errorf("after the reboot the claim pod runs on %q, before it on %q", got, claimed)
	}
	if got := cgroupOf(t, be).Files["cpuset.cpus.effective"]; strings.Contains(","+got+",", ","+claimed+",") {
		t.Errorf("after the reboot the BestEffort pod runs on %q, which includes the claimed CPU %s", got, claimed)
	}
	// One spec, for this claim, written after the boot.
	specs := guest(t, "ls /var/run/cdi")
	if strings.Count(specs, "\n")+1 != 1 || !strings.Contains(specs, string(claim.UID)[:8]) {
		t.Errorf("after the reboot /var/run/cdi holds %q, want one spec for claim %s", specs, claim.UID)
	}
	written := guest(t, "boot=$(( $(date +%s) - $(cut -d. -f1 /proc/uptime) )); m=$(stat -c %Y /var/run/cdi/*); [ \"$m\" -ge \"$boot\" ] && echo this-boot || echo before")
	if written != "this-boot" {
		t.Errorf("the claim's spec was not written in this boot: %s", written)
	}
	deletePod(t, ns, "pinned")
	poll(t, "the spec and the state to let the claim go", limit, func() (bool, error) {
		specs := guest(t, "ls /var/run/cdi | wc -l")
		held := guest(t, "grep -rl "+string(claim.UID)+" "+state+" | wc -l")
		return specs == "0" && held == "0", fmt.Errorf("%s specs, %s state files naming the claim", specs, held)
	})
}

// A claim for a CPU, memory and 2 MiB hugepages: its container's cpuset.mems is the claim's
// NUMA node and its hugetlb.2MB.max the claimed pages, which systemd does not manage and a
// daemon-reload leaves alone. And what the 1.37 kubelet writes for MemoryQoS (on by default
// there) into the container's and the pod's memory.min and memory.high, without the
// node-allocatable mapping and with it: logged here and documented in docs/deploy.md. Last:
// the agent's values it sets stay.
func TestAMemoryClaimsNodeAndHugepagesAndWhatMemoryQoSWrites(t *testing.T) {
	for _, mapped := range []bool{false, true} {
		t.Run(fmt.Sprintf("mapping=%v", mapped), func(t *testing.T) {
			ns := namespace(t)
			upgradeAgent(t, fmt.Sprintf("values-memory-%v.json", mapped), map[string]any{"config": map[string]any{
				"claim-memory": "10%", "claim-hugepages": true, "node-allocatable-memory": mapped}})
			claimTemplate(t, ns, "memory", map[string]string{"cpu": "1", "memory": "64Mi", "hugepages2Mi": "4Mi"}, "")
			pod := newPod(ns, "memory", "memory", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
				corev1.ResourceList{"hugepages-2Mi": resource.MustParse("4Mi")})
			pod = create(t, pod)
			claim := podClaim(t, pod)
			results := claim.Status.Allocation.Devices.Results
			if len(results) != 1 || !strings.HasPrefix(results[0].Device, "numa") {
				t.Fatalf("claim %s was allocated %+v, want one NUMA device", claim.Name, results)
			}
			numa := strings.TrimPrefix(results[0].Device, "numa")
			g := cgroupOf(t, pod)
			if got := g.Files["cpuset.mems.effective"]; got != numa {
				t.Errorf("the container has cpuset.mems.effective %q, want its claim's node %s", got, numa)
			}
			if got := g.Files["hugetlb.2MB.max"]; got != fmt.Sprint(4<<20) {
				t.Errorf("the container has hugetlb.2MB.max %s, want the claim's %d", got, 4<<20)
			}
			if got := g.Systemd["AllowedMemoryNodes"]; got != numa {
				t.Errorf("systemd holds AllowedMemoryNodes=%q for %s, the claim's node is %s", got, g.Unit, numa)
			}
			t.Logf("mapping %v: container memory.min %s memory.high %s memory.max %s; pod memory.min %s memory.high %s memory.max %s hugetlb.2MB.max %s; systemd MemoryMin %s MemoryHigh %s",
				mapped, g.Files["memory.min"], g.Files["memory.high"], g.Files["memory.max"], g.Pod["memory.min"], g.Pod["memory.high"],
				g.Pod["memory.max"], g.Pod["hugetlb.2MB.max"], g.Systemd["MemoryMin"], g.Systemd["MemoryHigh"])
			guest(t, "systemctl daemon-reload")
			after := cgroupOf(t, pod)
			for _, f := range []string{"cpuset.cpus.effective", "cpuset.mems.effective", "hugetlb.2MB.max", "memory.min", "memory.high", "memory.max"} {
				if after.Files[f] != g.Files[f] {
					t.Errorf("a daemon-reload changed the container's %s from %s to %s", f, g.Files[f], after.Files[f])
				}
			}
			deletePod(t, ns, "memory")
		})
	}
}
