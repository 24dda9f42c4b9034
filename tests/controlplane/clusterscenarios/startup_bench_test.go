package clusterscenarios

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// startupSamples is how many pods of each kind the start-up benchmark creates, one at a time.
const startupSamples = 20

// phases are the instants of one pod's start-up, each as seen by a watch, after its creation.
type phases struct {
	// claimed: the controller-manager created the pod's claim from its template; allocated: the
	// scheduler allocated it (claim pods only).
	claimed, allocated time.Duration
	// bound: the scheduler bound the pod to the node; running: the kubelet reports it Running.
	bound, running time.Duration
}

// BenchmarkPodStartup measures, on the same node in one run, the time from a pod's creation to
// the API server showing it Running, for a pod without a claim and the same pod with a
// one-CPU claim from a template (the controller's claim, the scheduler's allocation, the
// kubelet's prepare through the agent, the CDI device, the NRI placement). One pod at a time,
// each deleted (and its claim unprepared) before the next; it reports the median and the 99th
// percentile of each.
//
// To say what the claim's overhead is made of, it also reports the median of each phase, as
// the watches see them: creation to claim (the controller-manager's resourceclaim controller),
// claim to allocation (the scheduler, which waits for the claim), allocation to binding, and
// binding to Running (the node: the kubelet's prepare through the agent, the sandbox, CDI and
// NRI, the container's start), and the agent's own NodePrepareResources time, the mean of its
// resmgr_prepare_duration_seconds over the run.
func BenchmarkPodStartup(b *testing.B) {
	for _, kind := range []string{"plain", "claim"} {
		b.Run(kind, func(b *testing.B) {
			ns := namespace(b)
			if kind == "claim" {
				claimTemplate(b, ns, "one-cpu", 1)
			}
			prepareBefore := agentPrepareSeconds(b)
			var samples []phases
			for range b.N {
				samples = samples[:0]
				for i := range startupSamples {
					spec := podSpec{name: fmt.Sprintf("p%d", i)}
					if kind == "claim" {
						spec.template = "one-cpu"
					}
					samples = append(samples, startOne(b, ns, spec))
				}
			}
			median := func(of func(phases) time.Duration) time.Duration {
				d := make([]time.Duration, 0, len(samples))
				for _, s := range samples {
					d = append(d, of(s))
				}
				slices.Sort(d)
				return d[len(d)/2]
			}
			total := make([]time.Duration, 0, len(samples))
			for _, s := range samples {
				total = append(total, s.running)
			}
			slices.Sort(total)
			p99 := total[min(len(total)-1, (len(total)*99+99)/100-1)]
			b.ReportMetric(float64(total[len(total)/2].Nanoseconds()), "median-ns")
			b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns")
			node := median(func(s phases) time.Duration { return s.running - s.bound })
			b.ReportMetric(float64(node.Nanoseconds()), "bound-to-running-ns")
			b.Logf("%s: creation to Running median %s, p99 %s over %d pods", kind, total[len(total)/2], p99, len(samples))
			if kind == "claim" {
				claimed := median(func(s phases) time.Duration { return s.claimed })
				allocated := median(func(s phases) time.Duration { return s.allocated - s.claimed })
				bound := median(func(s phases) time.Duration { return s.bound - s.allocated })
				prepare := agentPrepareSeconds(b).since(prepareBefore)
				b.ReportMetric(float64(claimed.Nanoseconds()), "to-claim-ns")
				b.ReportMetric(float64(allocated.Nanoseconds()), "claim-to-allocated-ns")
				b.ReportMetric(float64(bound.Nanoseconds()), "allocated-to-bound-ns")
				b.ReportMetric(float64(prepare.Nanoseconds()), "agent-prepare-ns")
				b.Logf("%s: medians: creation to claim %s, claim to allocated %s, allocated to bound %s, bound to Running %s; the agent's prepare %s (mean)",
					kind, claimed, allocated, bound, node, prepare)
			} else {
				bound := median(func(s phases) time.Duration { return s.bound })
				b.ReportMetric(float64(bound.Nanoseconds()), "to-bound-ns")
				b.Logf("%s: medians: creation to bound %s, bound to Running %s", kind, bound, node)
			}
		})
	}
}

// prepareSeconds is the agent's resmgr_prepare_duration_seconds histogram's sum and count.
type prepareSeconds struct {
	sum   float64
	count float64
}

// since is the mean prepare time between p and an earlier reading (zero when none happened).
func (p prepareSeconds) since(before prepareSeconds) time.Duration {
	n := p.count - before.count
	if n <= 0 {
		return 0
	}
	return time.Duration((p.sum - before.sum) / n * float64(time.Second))
}

// agentPrepareSeconds reads the agent's prepare histogram from its /metrics, through the API
// server's proxy to the agent's pod.
func agentPrepareSeconds(b *testing.B) prepareSeconds {
	b.Helper()
	agent := agentPod(b)
	c, cancel := cx()
	defer cancel()
	raw, err := node.Client.CoreV1().Pods(agent.Namespace).ProxyGet("http", agent.Name, "8891", "metrics", nil).DoRaw(c)
	if err != nil {
		b.Fatalf("reading the agent's metrics through the API server: %v", err)
	}
	var p prepareSeconds
	var sawSum, sawCount bool
	for _, line := range strings.Split(string(raw), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "resmgr_prepare_duration_seconds_sum":
			p.sum, sawSum = v, true
		case "resmgr_prepare_duration_seconds_count":
			p.count, sawCount = v, true
		}
	}
	if !sawSum || !sawCount {
		b.Fatalf("the agent's metrics have no resmgr_prepare_duration_seconds sum and count:\n%s", raw)
	}
	return p
}

// startOne creates a pod, waits (watching the pod and the namespace's claims) until it is
// Running, returns when each phase was seen, and deletes it, waiting until it is gone.
func startOne(b *testing.B, ns string, spec podSpec) phases {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods := node.Client.CoreV1().Pods(ns)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + spec.name})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	// The claims of earlier pods may still be on their way out: only the claim this pod owns
	// counts.
	claims, err := node.Client.ResourceV1().ResourceClaims(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer claims.Stop()
	began := time.Now()
	created, err := pods.Create(ctx, spec.pod(ns), metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var seen phases
	for seen.running == 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the watch of pod %s ended", spec.name)
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted {
				continue
			}
			if seen.bound == 0 && pod.Spec.NodeName != "" {
				seen.bound = time.Since(began)
			}
			if pod.Status.Phase == corev1.PodRunning {
				seen.running = time.Since(began)
			}
		case ev, ok := <-claims.ResultChan():
			if !ok {
				b.Fatalf("the watch of the claims in %s ended", ns)
			}
			claim, isClaim := ev.Object.(*resourcev1.ResourceClaim)
			if !isClaim || ev.Type == watch.Deleted || !slices.ContainsFunc(claim.OwnerReferences,
				func(o metav1.OwnerReference) bool { return o.UID == created.UID }) {
				continue
			}
			if seen.claimed == 0 {
				seen.claimed = time.Since(began)
			}
			if seen.allocated == 0 && claim.Status.Allocation != nil {
				seen.allocated = time.Since(began)
			}
		case <-ctx.Done():
			b.Fatalf("pod %s/%s did not run within 2 minutes", ns, spec.name)
		}
	}
	if spec.template != "" && (seen.claimed == 0 || seen.allocated == 0 || seen.bound < seen.allocated) {
		b.Fatalf("pod %s/%s ran, but its claim's phases were not seen in order: %+v", ns, spec.name, seen)
	}
	if err := pods.Delete(ctx, spec.name, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the watch of pod %s ended", spec.name)
			}
			if ev.Type == watch.Deleted {
				return seen
			}
		case <-ctx.Done():
			b.Fatalf("pod %s/%s was not deleted within 2 minutes", ns, spec.name)
		}
	}
}

// BenchmarkClaimPodStartupDuringRollout measures what a rolling update of the agent (`kubectl
// rollout restart`: the new agent takes the node over from the old one) costs the claim pods
// created all along, beside the same pods with the agent left alone, in the same run: the median
// and 99th percentile of each pod's creation to Running (calm-p50, calm-p99, rollout-p50,
// rollout-p99). The rollout scenario's checks hold too: no failed prepare, every pod on its CPUs.
func BenchmarkClaimPodStartupDuringRollout(b *testing.B) {
	for range b.N {
		calm, during := rollOut(b, "kubectl rollout restart", restartAgents)
		b.ReportMetric(float64(median(calm).Nanoseconds()), "calm-p50-ns")
		b.ReportMetric(float64(p99(calm).Nanoseconds()), "calm-p99-ns")
		b.ReportMetric(float64(median(during).Nanoseconds()), "rollout-p50-ns")
		b.ReportMetric(float64(p99(during).Nanoseconds()), "rollout-p99-ns")
	}
}

// BenchmarkAgentGap measures what the windows no handover covers cost a claim pod created as
// the window opens (agentGap): the agent's pod deleted, and its process killed. It reports the
// time until an agent is Ready again (ready-ns) and until the claim's pod runs
// (claim-running-ns). Without retry-waiting-pods the kubelet would retry the pod's failed
// prepare at its resync, 60 to 90 s later.
func BenchmarkAgentGap(b *testing.B) {
	ns := namespace(b)
	claimTemplate(b, ns, "gap", 1)
	for _, how := range agentGaps {
		b.Run(strings.ReplaceAll(how, " ", "-"), func(b *testing.B) {
			for range b.N {
				ready, ran := agentGap(b, ns, "gap", how)
				b.ReportMetric(float64(ready.Nanoseconds()), "ready-ns")
				b.ReportMetric(float64(ran.Nanoseconds()), "claim-running-ns")
				b.Logf("agent %s: Ready after %s, a claim pod created then ran after %s", how, ready, ran)
			}
		})
	}
}
