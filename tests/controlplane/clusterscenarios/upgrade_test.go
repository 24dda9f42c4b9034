package clusterscenarios

import (
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// churnAfter is how long claim pods keep being created after a rollout is done: the old agent's
// pod goes and the new one serves alone.
const churnAfter = 30 * time.Second

// gapSettles bounds how long a claim pod's container created while no agent was connected to
// the runtime (the handover's gap) may run outside its claim's CPUs once the pod is Running: the
// new agent moves it as soon as the runtime tells it that it started the container.
const gapSettles = 2 * time.Second

// churn creates claim pods without a pause, one at a time (the node has one claimable CPU), each
// deleted once it runs, until done is closed and churnAfter has passed since; plain pods run
// alongside. After each claim pod runs it checks, in the kernel, that the pod runs on its claim's
// CPUs and that no other pod of the namespace runs on them. Returns each claim pod's creation to
// Running time.
func churn(t testing.TB, ns, prefix string, done <-chan struct{}) []time.Duration {
	t.Helper()
	claimTemplate(t, ns, prefix, 1)
	var plain []*corev1.Pod
	for _, name := range []string{prefix + "-plain-a", prefix + "-plain-b"} {
		create(t, ns, podSpec{name: name})
		plain = append(plain, running(t, ns, name))
	}
	var took []time.Duration
	var stopAt time.Time
	for i := 0; ; i++ {
		select {
		case <-done:
			if stopAt.IsZero() {
				stopAt = time.Now().Add(churnAfter)
			}
		default:
		}
		if !stopAt.IsZero() && time.Now().After(stopAt) {
			break
		}
		name := fmt.Sprintf("%s-%d", prefix, i)
		began := time.Now()
		create(t, ns, podSpec{name: name, template: prefix})
		pod := runningQuickly(t, ns, name)
		took = append(took, time.Since(began))
		p := placement(t, pod, "app")
		granted := grantedCPUs(t, p, podClaim(t, pod))
		if p.CgroupCPUs != granted || !allowedOnly(p, granted) {
			// Created in the handover's gap (tens of milliseconds with no agent connected to
			// the runtime): it started where the kubelet asked, and the new agent moves it
			// once the runtime says it started it. Never moved in gapSettles is a failure.
			was, began := p.CgroupCPUs, time.Now()
			for time.Since(began) < gapSettles && (p.CgroupCPUs != granted || !allowedOnly(p, granted)) {
				time.Sleep(10 * time.Millisecond)
				p = placement(t, pod, "app")
			}
			if p.CgroupCPUs != granted || !allowedOnly(p, granted) {
				t.Fatalf("%s runs on %q (%+v), its claim holds %q", name, p.CgroupCPUs, p.Processes, granted)
			}
			t.Logf("%s ran on %q when Running (created while no agent was connected), on its claim's %q %s later",
				name, was, granted, time.Since(began).Round(time.Millisecond))
		}
		for _, other := range plain {
			q := placement(t, other, "app")
			if overlaps(t, q.CgroupCPUs, granted) || !allowedOutside(t, q, granted) {
				t.Fatalf("%s runs on %q (%+v) while %s's claim holds %q", other.Name, q.CgroupCPUs, q.Processes, name, granted)
			}
		}
		deletePod(t, ns, name)
	}
	for _, pod := range plain {
		if p := placement(t, pod, "app"); p.CgroupCPUs != sharedCPUs(t) {
			t.Fatalf("%s runs on %q at the end, the shared CPUs are %q", pod.Name, p.CgroupCPUs, sharedCPUs(t))
		}
	}
	return took
}

// allowedOnly says whether every process of the container may run on cpus only.
func allowedOnly(p onenode.Placement, cpus string) bool {
	for _, proc := range p.Processes {
		if proc.CPUsAllowed != cpus {
			return false
		}
	}
	return len(p.Processes) > 0
}

// allowedOutside says whether no process of the container may run on any of cpus.
func allowedOutside(t testing.TB, p onenode.Placement, cpus string) bool {
	for _, proc := range p.Processes {
		if overlaps(t, proc.CPUsAllowed, cpus) {
			return false
		}
	}
	return len(p.Processes) > 0
}

// runningQuickly waits, polling every 20 ms, until the pod runs.
func runningQuickly(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		c, cancel := cx()
		pod, err := node.Client.CoreV1().Pods(ns).Get(c, name, metav1.GetOptions{})
		cancel()
		if err == nil && pod.Status.Phase == corev1.PodRunning {
			return running(t, ns, name)
		}
		if time.Now().After(deadline) {
			return running(t, ns, name) // fails, describing the pod
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// p99 of durations: the largest but one per hundred (with fewer than a hundred, the largest).
func p99(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)*99)/100-boolToInt(len(s) >= 100)]
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// failedPrepares are the kubelet's FailedPrepareDynamicResources Events in the namespace.
func failedPrepares(t testing.TB, ns string) []string {
	t.Helper()
	c, cancel := cx()
	defer cancel()
	events, err := node.Client.CoreV1().Events(ns).List(c, metav1.ListOptions{FieldSelector: "reason=FailedPrepareDynamicResources"})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events.Items {
		out = append(out, e.InvolvedObject.Name+": "+e.Message)
	}
	return out
}

// baseline is claim pods' creation to Running with nothing happening to the agent, in the same
// run as the rollouts it is compared with.
func baseline(t testing.TB, ns string) []time.Duration {
	t.Helper()
	done := make(chan struct{})
	close(done)
	// churnAfter of churn with the agent left alone.
	return churn(t, ns, "calm", done)
}

// rollOut runs act (what rolls the agent's DaemonSet) while claim pods are created, and checks
// that no prepare failed and that claim pods started as fast as without a rollout. Returns each
// claim pod's creation to Running, without a rollout (calm) and during it.
func rollOut(t testing.TB, what string, act func() error) (calm, during []time.Duration) {
	t.Helper()
	ns := namespace(t)
	calm = baseline(t, ns)
	before := agentPod(t)
	done := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(done)
		if err := act(); err != nil {
			errs <- err
			return
		}
		_, err := node.Kubectl("-n", onenode.Namespace, "rollout", "status", "daemonset/"+onenode.Release, "--timeout=3m")
		errs <- err
	}()
	during = churn(t, ns, "rolled", done)
	if err := <-errs; err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if after := agentPod(t); after.UID == before.UID {
		t.Fatalf("%s left the agent's pod %s as it was", what, before.Name)
	}
	if failed := failedPrepares(t, ns); len(failed) != 0 {
		t.Fatalf("the kubelet failed prepares during %s:\n%s", what, strings.Join(failed, "\n"))
	}
	t.Logf("%s: %d claim pods created meanwhile, creation to Running median %s p99 %s; without a rollout (%d pods) median %s p99 %s",
		what, len(during), median(during).Round(time.Millisecond), p99(during).Round(time.Millisecond),
		len(calm), median(calm).Round(time.Millisecond), p99(calm).Round(time.Millisecond))
	if p99(during) > p99(calm)+time.Second {
		t.Fatalf("during %s a claim pod took %s to run (p99), %s without one: more than 1 s later", what, p99(during), p99(calm))
	}
	return calm, during
}

// A helm upgrade that changes a setting rolls the agent: the new agent starts beside the old one
// and takes the node over. Claim pods created all along start as fast as without the upgrade,
// and the kubelet fails no prepare.
func TestAHelmUpgradeNeverStallsAClaimPod(t *testing.T) {
	_, _ = rollOut(t, "helm upgrade", func() error {
		// A new pod template on every run, the test's own runs again included (`--count N`).
		values, err := node.ValuesFile("values-rolling.json", map[string]any{
			"config":         map[string]any{"log-level": "info,resmgr::handover=debug"},
			"podAnnotations": map[string]any{"resmgr.io/test-upgrade": time.Now().Format(time.RFC3339Nano)},
		})
		if err != nil {
			return err
		}
		_, err = node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values)
		return err
	})
}

// kubectl rollout restart: the same, for a restart with nothing changed.
func TestARolloutRestartNeverStallsAClaimPod(t *testing.T) {
	_, _ = rollOut(t, "kubectl rollout restart", restartAgents)
}

// restartAgents is `kubectl rollout restart` of the agent's DaemonSet.
func restartAgents() error {
	_, err := node.Kubectl("-n", onenode.Namespace, "rollout", "restart", "daemonset/"+onenode.Release)
	return err
}

// readyAgent waits until an agent pod other than `gone` is Ready, or `gone` itself once its
// container restarted more than `restarts` times, and returns when it saw it Ready.
func readyAgent(t testing.TB, gone *corev1.Pod, restarts int32, same bool) time.Time {
	t.Helper()
	var at time.Time
	poll(t, "the agent to be Ready again", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		pods, err := node.Client.CoreV1().Pods(onenode.Namespace).List(c, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=resmgr"})
		if err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if (p.UID == gone.UID) != same || p.DeletionTimestamp != nil {
				continue
			}
			if same && (len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount <= restarts) {
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					at = time.Now()
					return true, nil
				}
			}
		}
		return false, nil
	})
	return at
}

// agentGaps are the windows no handover covers: the agent's pod deleted (without a surge the
// DaemonSet makes the next one only as the old one goes), and the agent's process killed
// (SIGKILL, as the OOM killer does; the kubelet restarts its container).
var agentGaps = []string{"pod deleted", "process killed"}

// agentGap opens the window `how` (one of agentGaps) and at the same instant creates a claim pod
// from template `template` of namespace ns. It checks, in the kernel, that the pod runs on its
// claim's CPUs, deletes it, and returns when the agent was Ready again and when the pod ran, each
// after the window opened.
func agentGap(t testing.TB, ns, template, how string) (ready, ran time.Duration) {
	t.Helper()
	agent := agentPod(t)
	restarts := agent.Status.ContainerStatuses[0].RestartCount
	name := template + "-" + strings.Fields(how)[1]
	c, cancel := cx()
	switch how {
	case "pod deleted":
		if err := node.Client.CoreV1().Pods(agent.Namespace).Delete(c, agent.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	case "process killed":
		procs := placement(t, agent, "resmgr").Processes
		if len(procs) == 0 {
			t.Fatal("the agent's container has no process")
		}
		if err := syscall.Kill(procs[0].PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("no agent gap %q", how)
	}
	cancel()
	began := time.Now()
	create(t, ns, podSpec{name: name, template: template})
	readyAt := readyAgent(t, agent, restarts, how == "process killed")
	pod := running(t, ns, name)
	ranAt := time.Now()
	p := placement(t, pod, "app")
	if granted := grantedCPUs(t, p, podClaim(t, pod)); p.CgroupCPUs != granted {
		t.Fatalf("%s runs on %q, its claim holds %q", name, p.CgroupCPUs, granted)
	}
	deletePod(t, ns, name)
	return readyAt.Sub(began), ranAt.Sub(began)
}

// A claim pod created in an agent gap has its prepare refused, or unroutable, and the kubelet
// would retry it only at its resync, 60 to 90 s later; the agent that comes back marks the
// node's waiting pods (retry-waiting-pods), which makes the kubelet prepare them at once. Each
// runs within 10 s of the agent being Ready again.
func TestAClaimPodCreatedWhileTheAgentIsDownRunsSoonAfterItIsBack(t *testing.T) {
	ns := namespace(t)
	claimTemplate(t, ns, "gap", 1)
	for _, how := range agentGaps {
		ready, ran := agentGap(t, ns, "gap", how)
		t.Logf("agent %s: the agent Ready %s later, a claim pod created then ran %s later, %s after the agent was Ready",
			how, ready.Round(10*time.Millisecond), ran.Round(10*time.Millisecond), (ran - ready).Round(10*time.Millisecond))
		if ran-ready > 10*time.Second {
			t.Fatalf("agent %s: the claim pod ran %s after the agent was Ready again, more than 10 s", how, ran-ready)
		}
	}
}
