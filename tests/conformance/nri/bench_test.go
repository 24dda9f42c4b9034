// Benchmark: the CreateContainer round trip through the adaptation to a trivial plugin, served
// once by our Rust stub (the `scripted` example, quiet) and once by a minimal plugin built on the
// upstream Go stub (github.com/containerd/nri/pkg/stub), in the same run. Both plugins are
// separate processes on the adaptation's socket, so both pay the same IPC. Reports the median and
// the 99th percentile of the per-call latency (`cargo xtask bench` collects them).
package nri

import (
	"context"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"
)

// goStubSocketEnv makes the test binary run as the Go stub plugin (see TestMain).
const goStubSocketEnv = "RESMGR_NRI_GO_STUB_SOCKET"

func TestMain(m *testing.M) {
	if socket := os.Getenv(goStubSocketEnv); socket != "" {
		os.Exit(runGoStubPlugin(socket))
	}
	os.Exit(m.Run())
}

// trivialPlugin answers CreateContainer with an empty adjustment.
type trivialPlugin struct{}

func (trivialPlugin) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return &api.ContainerAdjustment{}, nil, nil
}

func runGoStubPlugin(socket string) int {
	s, err := stub.New(trivialPlugin{}, stub.WithSocketPath(socket), stub.WithPluginName("gostub"),
		stub.WithPluginIdx("10"), stub.WithOnClose(func() { os.Exit(0) }))
	if err != nil {
		return 1
	}
	if err := s.Run(context.Background()); err != nil {
		return 1
	}
	return 0
}

func startGoStubPlugin(b *testing.B, socket string) {
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), goStubSocketEnv+"="+socket)
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting the Go stub plugin: %v", err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// quietLogger drops the adaptation's log lines: go test prints the test binary's stderr into the
// same stream as the benchmark result lines, and a log line inside one breaks its parsing.
type quietLogger struct{}

func (quietLogger) Debugf(context.Context, string, ...interface{}) {}
func (quietLogger) Infof(context.Context, string, ...interface{})  {}
func (quietLogger) Warnf(context.Context, string, ...interface{})  {}
func (quietLogger) Errorf(context.Context, string, ...interface{}) {}

func BenchmarkCreateContainerRoundTrip(b *testing.B) {
	previous := nrilog.Get()
	nrilog.Set(quietLogger{})
	b.Cleanup(func() { nrilog.Set(previous) })
	b.Run("rust-stub", func(b *testing.B) {
		benchCreateContainer(b, func(socket string) {
			startPlugin(b, "scripted", "--socket", socket, "--quiet")
		})
	})
	b.Run("go-stub", func(b *testing.B) {
		benchCreateContainer(b, func(socket string) { startGoStubPlugin(b, socket) })
	})
}

func benchCreateContainer(b *testing.B, start func(socket string)) {
	rt := newFakeRuntime(b, nil, nil)
	start(rt.socket)
	if res := rt.waitSynchronized(); res.err != nil {
		b.Fatalf("synchronize: %v", res.err)
	}
	ctx := context.Background()
	req := &api.CreateContainerRequest{Pod: pod("p0"), Container: container("p0", "c0")}
	call := func() time.Duration {
		start := time.Now()
		if _, err := rt.r.CreateContainer(ctx, req); err != nil {
			b.Fatalf("CreateContainer: %v", err)
		}
		return time.Since(start)
	}
	for i := 0; i < 200; i++ { // warm up connections, allocators and caches
		call()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		lat = append(lat, call())
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "median-ns")
	b.ReportMetric(float64(lat[(len(lat)*99+99)/100-1].Nanoseconds()), "p99-ns")
}
