package clusterscenarios

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// startupSamples is how many pods of each kind the start-up benchmark creates, one at a time.
const startupSamples = 20

// BenchmarkPodStartup measures, on the same node in one run, the time from a pod's creation to
// the API server showing it Running, for a pod without a claim and the same pod with a
// one-CPU claim from a template (the controller's claim, the scheduler's allocation, the
// kubelet's prepare through the agent, the CDI device, the NRI placement). One pod at a time,
// each deleted (and its claim unprepared) before the next; it reports the median and the 99th
// percentile of each.
func BenchmarkPodStartup(b *testing.B) {
	for _, kind := range []string{"plain", "claim"} {
		b.Run(kind, func(b *testing.B) {
			ns := namespace(b)
			if kind == "claim" {
				claimTemplate(b, ns, "one-cpu", 1)
			}
			var samples []time.Duration
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
			slices.Sort(samples)
			median := samples[len(samples)/2]
			p99 := samples[min(len(samples)-1, (len(samples)*99+99)/100-1)]
			b.ReportMetric(float64(median.Nanoseconds()), "median-ns")
			b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns")
			b.Logf("%s: creation to Running median %s, p99 %s over %d pods", kind, median, p99, len(samples))
		})
	}
}

// startOne creates a pod, waits (watching) until it is Running, returns how long that took, and
// deletes it, waiting until it is gone.
func startOne(b *testing.B, ns string, spec podSpec) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods := node.Client.CoreV1().Pods(ns)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + spec.name})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	began := time.Now()
	if _, err := pods.Create(ctx, spec.pod(ns), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var took time.Duration
	for took == 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the watch of pod %s ended", spec.name)
			}
			if pod, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted && pod.Status.Phase == corev1.PodRunning {
				took = time.Since(began)
			}
		case <-ctx.Done():
			b.Fatalf("pod %s/%s did not run within 2 minutes", ns, spec.name)
		}
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
				return took
			}
		case <-ctx.Done():
			b.Fatalf("pod %s/%s was not deleted within 2 minutes", ns, spec.name)
		}
	}
}

// BenchmarkAgentRestartToServing measures what an agent restart costs new claims with the real
// kubelet: the agent's pod is deleted (the DaemonSet makes another) and at the same instant a
// pod with a one-CPU claim is created. It reports the time until the new agent pod is Ready
// (ready-ns) and until the claim's pod runs (claim-running-ns); the kubelet retries a refused
// or unroutable prepare only at its periodic pod resync, so a claim that arrives in the window
// waits for that.
func BenchmarkAgentRestartToServing(b *testing.B) {
	ns := namespace(b)
	claimTemplate(b, ns, "one-cpu", 1)
	for i := range b.N {
		agent := agentPod(b)
		pods := node.Client.CoreV1().Pods(ns)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		began := time.Now()
		if err := node.Client.CoreV1().Pods(agent.Namespace).Delete(ctx, agent.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		spec := podSpec{name: fmt.Sprintf("after-restart-%d", i), template: "one-cpu"}
		if _, err := pods.Create(ctx, spec.pod(ns), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var ready, running time.Duration
		for ready == 0 || running == 0 {
			if ready == 0 {
				list, err := node.Client.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=resmgr"})
				if err != nil {
					b.Fatal(err)
				}
				for _, p := range list.Items {
					for _, c := range p.Status.Conditions {
						if p.UID != agent.UID && c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
							ready = time.Since(began)
						}
					}
				}
			}
			if running == 0 {
				p, err := pods.Get(ctx, spec.name, metav1.GetOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if p.Status.Phase == corev1.PodRunning {
					running = time.Since(began)
				}
			}
			if ctx.Err() != nil {
				b.Fatalf("after 5 minutes: agent ready after %s, claim pod running after %s", ready, running)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		b.ReportMetric(float64(ready.Nanoseconds()), "ready-ns")
		b.ReportMetric(float64(running.Nanoseconds()), "claim-running-ns")
		b.Logf("agent pod deleted: the new one Ready after %s, a claim created at the deletion ran after %s", ready, running)
		deletePod(b, ns, spec.name)
	}
}
