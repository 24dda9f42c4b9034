// Round-trip cost of the kubelet's calls to our servers: one-claim NodePrepareResources and
// GetInfo, over both dial styles. Every request passes through the :authority rewrite (which
// decodes and re-encodes its headers); on the bare-path dial it also replaces the authority.
// Comparing the two styles shows what the replacement costs on top of the parsing.
package kubelet

import (
	"context"
	"sort"
	"testing"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// reportLatency adds median and p99 of the per-call durations to the benchmark's output.
func reportLatency(b *testing.B, durations []time.Duration) {
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	b.ReportMetric(float64(durations[len(durations)/2].Nanoseconds()), "median-ns")
	b.ReportMetric(float64(durations[len(durations)*99/100].Nanoseconds()), "p99-ns")
}

func BenchmarkPrepareOneClaim(b *testing.B) {
	p := startPlugin(b)
	for _, version := range versions {
		for _, style := range dialStyles {
			b.Run(version.name+"/"+style.name, func(b *testing.B) {
				client := version.newClient(style.dial(b, p.draSocket()))
				claims := []claim{{"ns", "uid-bench", "bench"}}
				durations := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
					start := time.Now()
					got, err := client.prepare(ctx, claims)
					durations = append(durations, time.Since(start))
					cancel()
					if err != nil || len(got) != 1 {
						b.Fatalf("prepare: %v, %v", got, err)
					}
				}
				b.StopTimer()
				reportLatency(b, durations)
			})
		}
	}
}

func BenchmarkGetInfo(b *testing.B) {
	p := startPlugin(b)
	for _, style := range dialStyles {
		b.Run(style.name, func(b *testing.B) {
			client := registerapi.NewRegistrationClient(style.dial(b, p.registrationSocket()))
			durations := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				start := time.Now()
				_, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
				durations = append(durations, time.Since(start))
				cancel()
				if err != nil {
					b.Fatalf("GetInfo: %v", err)
				}
			}
			b.StopTimer()
			reportLatency(b, durations)
		})
	}
}
