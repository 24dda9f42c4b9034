package clusterscenarios

// What the runtimes do differently under the real kubelet, which the CRI-O stage's runner
// (tests/src/bin/e2e, which plays the kubelet) had found or left open: the sandbox's infra
// container, what NRI plugins are told of a claim's CDI device, and how a pod is removed. Every
// other scenario runs the same on both runtimes without asking which one it is on; these three
// ask the node (node.Runtime()), and each says what both runtimes do and where they differ.

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// sleepIgnoringSIGTERM is a container's command that ignores SIGTERM, as any program that sets
// no handler does as PID 1 of its namespace: the kubelet kills it at the end of its grace period.
var sleepIgnoringSIGTERM = []string{"/bin/sleep", "2147483647"}

// sandboxCgroups are the cgroups of a pod, with their processes, that belong to none of its
// containers and are not CRI-O's conmon's (which monitors each container from the pod's cgroup):
// the runtime's sandbox (containerd's pause container, CRI-O's infra container), whose process
// is the image's /bin/pause here, a shell that sleeps until SIGTERM like Kubernetes' pause.
func sandboxCgroups(cgroups map[string][]onenode.Process, containers []string) map[string][]onenode.Process {
	out := map[string][]onenode.Process{}
	for name, procs := range cgroups {
		if slices.Contains(containers, name) || strings.HasPrefix(name, "crio-conmon-") {
			continue
		}
		for _, p := range procs {
			if p.Name != "conmon" {
				out[name] = append(out[name], p)
			}
		}
	}
	return out
}

// Open question 1 of the CRI-O note: pods with an infra container. The kubelet asks for a PID
// namespace per container unless the pod shares one (shareProcessNamespace); CRI-O then runs no
// infra container (drop_infra_ctr, on by default), containerd always runs its pause container.
// A pod that shares its PID namespace gets one on both: a sandbox process in the pod's cgroup,
// outside its containers', PID 1 of the namespace its containers share (here the test image's /bin/pause,
// CRI-O's pause_image and containerd's sandbox image on this node). Neither runtime tells NRI
// plugins of it as a container (only of the pod's sandbox), so the agent places it nowhere: it
// keeps the pod cgroup's cpuset, and sleeps. The claim's container runs on its claim's CPUs
// either way. (The CRI-O stage's runner asks for a PID namespace per container: the infra
// container's oom_score_adj of -998 takes CAP_SYS_RESOURCE, which the machine's container
// lacks; the cluster's runc wrapper deals with that, onenode/runtime.go.)
func TestAPodSharingItsPIDNamespaceRunsWithAnInfraContainerAndItsClaimPinsIt(t *testing.T) {
	observer := observeNRI(t)
	ns := namespace(t)
	claimTemplate(t, ns, "one-cpu", 1)
	shared := podSpec{name: "shared-pid", template: "one-cpu"}.pod(ns)
	yes := true
	shared.Spec.ShareProcessNamespace = &yes
	c, cancel := cx()
	_, err := node.Client.CoreV1().Pods(ns).Create(c, shared, metav1.CreateOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	create(t, ns, podSpec{name: "own-pid"})

	pod := running(t, ns, "shared-pid")
	id := containerID(t, pod, "app")
	p := placement(t, pod, "app")
	granted := grantedCPUs(t, p, podClaim(t, pod))
	if p.CgroupCPUs != granted {
		t.Fatalf("the kernel runs the container of the pod sharing its PID namespace on %q, its claim holds %q", p.CgroupCPUs, granted)
	}
	cgroups, err := node.PodCgroups(id)
	if err != nil {
		t.Fatal(err)
	}
	app := cgroups[node.ContainerCgroupName(id)]
	if len(app) == 0 {
		t.Fatalf("no process in the container's cgroup: %+v", cgroups)
	}
	var infra []onenode.Process
	for _, procs := range sandboxCgroups(cgroups, []string{node.ContainerCgroupName(id)}) {
		for _, s := range procs {
			if s.PIDNamespace == app[0].PIDNamespace && len(s.NSPID) > 0 && s.NSPID[len(s.NSPID)-1] == 1 {
				infra = append(infra, s)
			}
		}
	}
	if len(infra) != 1 {
		t.Fatalf("on %s, want one sandbox process in the pod's cgroup that is PID 1 of the container's PID namespace, found %d: %+v",
			node.Runtime(), len(infra), cgroups)
	}
	if own := app[0].NSPID; len(own) == 0 || own[len(own)-1] == 1 {
		t.Fatalf("the container's process is PID %v in the shared namespace: the sandbox should be PID 1", own)
	}
	var created []string
	for _, e := range observer.of(ns, "shared-pid") {
		if e.event == "CreateContainer" {
			created = append(created, e.container.Name)
		}
	}
	if !slices.Equal(created, []string{"app"}) {
		t.Fatalf("the runtime told NRI plugins of containers %v of the pod, want only app:%s", created, describeEvents(observer.of(ns, "shared-pid")))
	}
	t.Logf("%s: the pod sharing its PID namespace runs infra process %d (%s, PID 1 of the shared namespace, Cpus_allowed_list %s, not placed by the agent) next to its container on its claim's %q",
		node.Runtime(), infra[0].PID, infra[0].Name, infra[0].CPUsAllowed, granted)

	// The default: a PID namespace per container. The container's process is PID 1 of its own;
	// only containerd runs a sandbox process for the pod.
	own := running(t, ns, "own-pid")
	ownID := containerID(t, own, "app")
	cgroups, err = node.PodCgroups(ownID)
	if err != nil {
		t.Fatal(err)
	}
	procs := cgroups[node.ContainerCgroupName(ownID)]
	if len(procs) == 0 || procs[0].NSPID[len(procs[0].NSPID)-1] != 1 {
		t.Fatalf("the container of the pod with a PID namespace per container is not PID 1 of its own: %+v", procs)
	}
	sandbox := sandboxCgroups(cgroups, []string{node.ContainerCgroupName(ownID)})
	wantSandbox := map[onenode.Runtime]int{onenode.Containerd: 1, onenode.CRIO: 0}[node.Runtime()]
	if len(sandbox) != wantSandbox {
		t.Fatalf("on %s the pod with a PID namespace per container has %d sandbox containers, want %d: %+v", node.Runtime(), len(sandbox), wantSandbox, cgroups)
	}
	t.Logf("%s: the pod with a PID namespace per container (the kubelet's default) has %d sandbox containers", node.Runtime(), len(sandbox))
	deletePod(t, ns, "shared-pid")
	deletePod(t, ns, "own-pid")
}

// Open question 2 of the CRI-O note: what NRI plugins are told of a claim. The real kubelet
// hands the runtime the claim's CDI device, and the runtime injects the device's edits (the
// DRA_CPUSET_ variables) before it asks NRI plugins about the container. containerd (from 2.3)
// also lists the device in the container it tells plugins of; CRI-O 1.36 lists none, so the
// agent finds a container's claim by the variables the claim's CDI spec sets
// (policy::claim_env). Both ways the kernel runs the container on exactly the claim's CPUs.
func TestTheRuntimeTellsNRIPluginsOfAClaimByItsCDIDeviceOrOnlyByItsEnvironment(t *testing.T) {
	observer := observeNRI(t)
	ns := namespace(t)
	claimTemplate(t, ns, "one-cpu", 1)
	create(t, ns, podSpec{name: "claimed", template: "one-cpu"})
	pod := running(t, ns, "claimed")
	claim := podClaim(t, pod)
	p := placement(t, pod, "app")
	granted := grantedCPUs(t, p, claim)
	if p.CgroupCPUs != granted {
		t.Fatalf("the kernel runs the claim's container on %q, its claim holds %q", p.CgroupCPUs, granted)
	}
	created, ok := observer.first(ns, "claimed", "CreateContainer", "app")
	if !ok {
		t.Fatalf("the runtime told NRI plugins nothing of container app:%s", describeEvents(observer.of(ns, "claimed")))
	}
	variable := "DRA_CPUSET_" + strings.ReplaceAll(string(claim.UID), "-", "_") + "=" + granted
	if !slices.Contains(created.container.Env, variable) {
		t.Fatalf("the container NRI plugins were told of lacks %s: %v", variable, created.container.Env)
	}
	var devices []string
	for _, d := range created.container.CDIDevices {
		devices = append(devices, d.Name)
	}
	device := driver + "/device=claim-" + string(claim.UID) + "-0"
	switch node.Runtime() {
	case onenode.Containerd:
		if !slices.Contains(devices, device) {
			t.Fatalf("containerd told NRI plugins of CDI devices %v, want %s", devices, device)
		}
	case onenode.CRIO:
		if len(devices) != 0 {
			t.Fatalf("CRI-O told NRI plugins of CDI devices %v: the agent may find claims by their device here too (docs/deploy.md says it cannot)", devices)
		}
	}
	t.Logf("%s told NRI plugins of CDI devices %v and %s; the kernel runs the container on its claim's %q", node.Runtime(), devices, variable, granted)
	deletePod(t, ns, "claimed")
}

// Open question 3 of the CRI-O note: what makes removing a pod slower on CRI-O, and whether it
// delays an unprepare. CRI-O's StopPodSandbox stops the containers still running with SIGTERM
// and waits for them up to the request's deadline less one second before SIGKILL, where
// containerd's kills them at once: the CRI-O stage's runner, which removed pods the way crictl
// does (StopPodSandbox on running containers, 30 s deadline), waited out each one's sleep, PID 1
// of its namespace, which ignores SIGTERM. The kubelet never does that: it stops each container
// first, with the pod's grace period, then the sandbox, then unprepares the pod's claims. So
// here, on both runtimes, with a sleep that ignores SIGTERM (sleepIgnoringSIGTERM): the
// container is killed at the end of its grace period, the sandbox stops right after, and the claim's CDI spec is removed right after that;
// nothing of CRI-O's waiting is left for the unprepare.
func TestDeletingAClaimPodUnpreparesRightAfterTheKubeletStopsItsContainers(t *testing.T) {
	observer := observeNRI(t)
	ns := namespace(t)
	claimTemplate(t, ns, "one-cpu", 1)
	const grace = 3 * time.Second
	spec := podSpec{name: "leaving", template: "one-cpu"}.pod(ns)
	spec.Spec.Containers[0].Command = sleepIgnoringSIGTERM
	seconds := int64(grace / time.Second)
	spec.Spec.TerminationGracePeriodSeconds = &seconds
	c, cancel := cx()
	_, err := node.Client.CoreV1().Pods(ns).Create(c, spec, metav1.CreateOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	pod := running(t, ns, "leaving")
	claim := podClaim(t, pod)
	id := containerID(t, pod, "app")
	specFile := filepath.Join(node.CDIDir(), driver+"-device_"+string(claim.UID)+".json")
	if _, err := os.Stat(specFile); err != nil {
		t.Fatalf("the claim's CDI spec: %v", err)
	}

	c, cancel = cx()
	err = node.Client.CoreV1().Pods(ns).Delete(c, "leaving", metav1.DeleteOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var exited, unprepared, gone time.Duration
	for exited == 0 || unprepared == 0 || gone == 0 {
		if time.Since(began) > limit {
			t.Fatalf("after %s: the container exited after %s, the spec was removed after %s, the pod left the API after %s (0: not yet)",
				limit, exited, unprepared, gone)
		}
		now := time.Since(began)
		if _, err := node.Placement(id); exited == 0 && err != nil {
			exited = now
		}
		if _, err := os.Stat(specFile); unprepared == 0 && errors.Is(err, os.ErrNotExist) {
			unprepared = now
		}
		if gone == 0 {
			c, cancel := cx()
			_, err := node.Client.CoreV1().Pods(ns).Get(c, "leaving", metav1.GetOptions{})
			cancel()
			if apierrors.IsNotFound(err) {
				gone = now
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	at := func(event, container string) time.Duration {
		e, ok := observer.first(ns, "leaving", event, container)
		if !ok {
			t.Fatalf("the runtime told NRI plugins of no %s:%s", event, describeEvents(observer.of(ns, "leaving")))
		}
		return e.at.Sub(began)
	}
	stopped, sandbox := at("StopContainer", "app"), at("StopPodSandbox", "")
	t.Logf("%s, grace period %s: the container's processes gone after %s (NRI StopContainer %s), the sandbox stopped after %s, the claim unprepared (its CDI spec removed) after %s, the pod gone from the API after %s",
		node.Runtime(), grace, exited.Round(time.Millisecond), stopped.Round(time.Millisecond), sandbox.Round(time.Millisecond),
		unprepared.Round(time.Millisecond), gone.Round(time.Millisecond))
	// The sleep ignores SIGTERM: the kubelet kills it at the end of the grace period.
	if exited < grace-time.Second || exited > grace+10*time.Second {
		t.Errorf("the container exited %s after the deletion, want about its grace period %s", exited, grace)
	}
	const soon = 3 * time.Second
	if sandbox < stopped || sandbox-stopped > soon {
		t.Errorf("the sandbox stopped %s after the container (NRI), want within %s: the runtime waited for something", sandbox-stopped, soon)
	}
	if unprepared < exited || unprepared-sandbox > soon {
		t.Errorf("the claim was unprepared %s after the sandbox stopped and %s after the container exited, want after both and within %s",
			unprepared-sandbox, unprepared-exited, soon)
	}
}

// A claim released while the containers the agent moves back onto its CPUs are being stopped:
// the claim's pod and the shared pods next to it are deleted at once, as a namespace's deletion
// or a rollout does, so the agent's UpdateContainers, moving the shared containers back onto the
// claim's CPU, meets the kubelet's StopContainer of those same containers, which the kubelet
// kills only at the end of their grace period (their sleep ignores SIGTERM). The updates of the
// containers that stopped meanwhile fail, the agent drops them when the runtime reports the
// containers stopped, every pod goes, the claim is unprepared, and the next claim is prepared
// and pinned: neither the runtime nor the agent is left stuck. On CRI-O 1.36 (NRI v0.11) this is
// where an UpdateContainers can deadlock the runtime: its NRI adaptation takes its lock and then
// CRI-O's for a plugin's update, and every event takes them the other way round. An update
// retried while the runtime still applies a slow one (runc waits for a container being killed)
// once met the kubelet's StopContainer that way here (docs/deploy.md#cri-o-under-the-kubelet);
// the agent now never sends an update while the runtime has not answered the one before, and
// waits for the runtime's events to pause (nri::UpdateLull).
func TestAClaimReleasedWhileTheContainersItMovesBackStop(t *testing.T) {
	ns := namespace(t)
	restarts := agentPod(t).Status.ContainerStatuses[0].RestartCount
	shared := []string{"stopping-a", "stopping-b"}
	for _, name := range shared {
		pod := podSpec{name: name}.pod(ns)
		pod.Spec.Containers[0].Command = sleepIgnoringSIGTERM
		grace := int64(2)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		c, cancel := cx()
		_, err := node.Client.CoreV1().Pods(ns).Create(c, pod, metav1.CreateOptions{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	pinned, granted := pinnedPod(t, ns, "pinned")
	for _, name := range shared {
		pod := running(t, ns, name)
		poll(t, name+" to run off the claim's CPUs "+granted, limit, func() (bool, error) {
			now := placement(t, pod, "app").CgroupCPUs
			return now != "" && !overlaps(t, now, granted), nil
		})
	}
	claim := podClaim(t, pinned)
	specFile := filepath.Join(node.CDIDir(), driver+"-device_"+string(claim.UID)+".json")
	began := time.Now()
	for _, name := range append([]string{"pinned"}, shared...) {
		c, cancel := cx()
		err := node.Client.CoreV1().Pods(ns).Delete(c, name, metav1.DeleteOptions{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range append([]string{"pinned"}, shared...) {
		poll(t, "pod "+name+" to be gone", limit, func() (bool, error) {
			c, cancel := cx()
			defer cancel()
			_, err := node.Client.CoreV1().Pods(ns).Get(c, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
	}
	poll(t, "the claim's CDI spec to be removed", limit, func() (bool, error) {
		_, err := os.Stat(specFile)
		return errors.Is(err, os.ErrNotExist), err
	})
	t.Logf("%s: the claim's pod and the two shared pods it moved went together in %s", node.Runtime(), time.Since(began).Round(time.Millisecond))
	_, after := pinnedPod(t, ns, "after")
	if now := agentPod(t).Status.ContainerStatuses[0].RestartCount; now != restarts {
		t.Fatalf("the agent restarted %d times meanwhile", now-restarts)
	}
	t.Logf("a claim afterwards got %q", after)
}
