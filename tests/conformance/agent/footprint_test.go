// Benchmark: the agent's resident memory with 500 containers, the figure the chart's resources
// requests and limits are sized from. The real `resmgr run` (the release build `cargo xtask
// bench` passes in RESMGR_BIN_DIR) serves containerd's own NRI runtime side (pkg/adaptation, a
// fake runtime behind it) on a two-socket, 64-core machine: 250 containers are running when it
// synchronizes, 250 more are created through CreateContainer, all with the labels, annotations
// and environment the kubelet gives them. With DRA (`dra`) it also talks to the fake API server
// and serves the kubelet sockets, as in a cluster; `nri-only` is `dra: false`.
//
// Reported (from /proc/<pid>/status, read once the 500th CreateContainer is answered):
// VmRSS-bytes (resident now), VmHWM-bytes (the peak), RssAnon-bytes (heap and stacks, what
// containers and the allocator cost; the rest is the binary's and libraries' pages), and
// idle-VmRSS-bytes and idle-RssAnon-bytes (after a Synchronize of one container, before the 500).
// Where the resident file pages come from, from /proc/<pid>/smaps: RssBinary-bytes (the agent's
// own executable: its code and read-only data) and RssLibs-bytes (the shared libraries: libc,
// libhwloc and what they load).
package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
)

const (
	footprintTopology   = "pack:2 numa:2 core:16 pu:2"
	footprintRunning    = 250
	footprintContainers = 500
)

func BenchmarkFootprint(b *testing.B) {
	// The adaptation's log lines would land inside the benchmark's result line.
	previous := nrilog.Get()
	nrilog.Set(quietLogger{})
	b.Cleanup(func() { nrilog.Set(previous) })
	for _, mode := range []struct {
		name string
		dra  bool
	}{{"dra", true}, {"nri-only", false}} {
		b.Run(mode.name, func(b *testing.B) {
			var last map[string]float64
			for i := 0; i < b.N; i++ {
				last = footprint(b, mode.dra)
			}
			for _, unit := range []string{"idle-VmRSS-bytes", "idle-RssAnon-bytes", "VmRSS-bytes", "VmHWM-bytes", "RssAnon-bytes", "RssBinary-bytes", "RssLibs-bytes"} {
				b.ReportMetric(last[unit], unit)
			}
		})
	}
}

// footprint runs the agent through the 500 containers and returns its memory figures.
func footprint(b *testing.B, dra bool) map[string]float64 {
	idle := startSetup(b, setup{dra: dra, topology: footprintTopology, dropUpdates: true})
	waitActive(idle)
	idleFigures := status(b, idle.agent.Process.Pid)
	stop(idle)

	s := setup{dra: dra, topology: footprintTopology, dropUpdates: true}
	for i := 0; i < footprintRunning; i++ {
		pod, container := kubeletContainer(i)
		container.State = api.ContainerState_CONTAINER_RUNNING
		s.running = append(s.running, pod)
		s.containers = append(s.containers, container)
	}
	c := startSetup(b, s)
	waitActive(c)
	// The adaptation reports its plugin count on every CreateContainer; nothing reads it now.
	drained := make(chan struct{})
	defer close(drained)
	go func() {
		for {
			select {
			case <-c.active:
			case <-drained:
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for i := footprintRunning; i < footprintContainers; i++ {
		pod, container := kubeletContainer(i)
		if _, err := c.runtime.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: container}); err != nil {
			b.Fatalf("CreateContainer %d: %v", i, err)
		}
	}
	_, metrics := get(b, "http://"+c.metrics+"/metrics")
	want := fmt.Sprintf(`resmgr_nri_events_total{kind="create-container"} %d`, footprintContainers-footprintRunning)
	if !strings.Contains(metrics, want) {
		b.Fatalf("/metrics lacks %q:\n%s", want, metrics)
	}
	figures := status(b, c.agent.Process.Pid)
	binary, libs := fileRss(b, c.agent.Process.Pid)
	stop(c)
	return map[string]float64{
		"RssBinary-bytes":    binary,
		"RssLibs-bytes":      libs,
		"idle-VmRSS-bytes":   idleFigures["VmRSS"],
		"idle-RssAnon-bytes": idleFigures["RssAnon"],
		"VmRSS-bytes":        figures["VmRSS"],
		"VmHWM-bytes":        figures["VmHWM"],
		"RssAnon-bytes":      figures["RssAnon"],
	}
}

// kubeletContainer is pod i with one container as the kubelet creates them: a tenth Guaranteed
// (one CPU), a tenth BestEffort, the rest Burstable; with the kubelet's labels and annotations
// and a service-link environment.
func kubeletContainer(i int) (*api.PodSandbox, *api.Container) {
	name, uid := fmt.Sprintf("app-%d", i), fmt.Sprintf("6f1c0000-0000-4000-8000-%012d", i)
	class, cpu := "burstable", &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 256}}
	switch i % 10 {
	case 0:
		class = ""
		cpu = &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 1024},
			Quota: &api.OptionalInt64{Value: 100000}, Period: &api.OptionalUInt64{Value: 100000}}
	case 1:
		class, cpu = "besteffort", &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: 2}}
	}
	parent := "kubepods-pod" + uid + ".slice"
	if class != "" {
		parent = "kubepods-" + class + "-pod" + uid + ".slice"
	}
	labels := map[string]string{
		"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "apps", "io.kubernetes.pod.uid": uid,
		"app.kubernetes.io/name": "app", "pod-template-hash": "5d8f7c9b4",
	}
	pod := &api.PodSandbox{Id: "sb-" + uid, Name: name, Uid: uid, Namespace: "apps", Labels: labels,
		Annotations: map[string]string{
			"kubernetes.io/config.seen": "2026-12-01T09:00:00.000000000Z", "kubernetes.io/config.source": "api"},
		Linux: &api.LinuxPodSandbox{CgroupParent: parent}}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + name,
		"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443",
		"KUBERNETES_PORT=tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO=tcp", "KUBERNETES_PORT_443_TCP_PORT=443", "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1"}
	container := &api.Container{Id: "ctr-" + uid, PodSandboxId: "sb-" + uid, Name: "app", Labels: map[string]string{
		"io.kubernetes.container.name": "app", "io.kubernetes.pod.name": name,
		"io.kubernetes.pod.namespace": "apps", "io.kubernetes.pod.uid": uid},
		Annotations: map[string]string{
			"io.kubernetes.container.hash": "8a1b2c3d", "io.kubernetes.container.restartCount": "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File", "io.kubernetes.pod.terminationGracePeriod": "30"},
		Env:   env,
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: cpu}}}
	return pod, container
}

// waitActive waits until the agent is an active NRI plugin (synchronized) and, with DRA, ready
// after a kubelet registration.
func waitActive(c *cluster) {
	c.t.Helper()
	for n := 0; n != 1; {
		select {
		case n = <-c.active:
		case err := <-c.exited:
			c.t.Fatalf("resmgr run exited (%v) before registering with the runtime", err)
		case <-time.After(waitLimit):
			c.t.Fatal("resmgr never became an active NRI plugin")
		}
	}
	if c.dra {
		c.registerLikeTheKubelet()
	}
	c.waitFor("/readyz to say ready", func() bool {
		code, _ := get(c.t, "http://"+c.metrics+"/readyz")
		return code == http.StatusOK
	})
}

// stop ends the agent with SIGTERM, as the kubelet does, and waits for it.
func stop(c *cluster) {
	c.t.Helper()
	if err := c.agent.Process.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatal(err)
	}
	select {
	case err := <-c.exited:
		if err != nil {
			c.t.Fatalf("resmgr run exited with %v after SIGTERM", err)
		}
	case <-time.After(waitLimit):
		c.t.Fatal("resmgr run did not stop after SIGTERM")
	}
}

// quietLogger drops the adaptation's log lines.
type quietLogger struct{}

func (quietLogger) Debugf(context.Context, string, ...interface{}) {}
func (quietLogger) Infof(context.Context, string, ...interface{})  {}
func (quietLogger) Warnf(context.Context, string, ...interface{})  {}
func (quietLogger) Errorf(context.Context, string, ...interface{}) {}

// status reads the memory figures of /proc/<pid>/status, in bytes.
func status(b *testing.B, pid int) map[string]float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	figures := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		key, value, ok := strings.Cut(line, ":")
		fields := strings.Fields(value)
		if !ok || len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		kib, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			b.Fatalf("%s in /proc/%d/status: %v", line, pid, err)
		}
		figures[key] = kib * 1024
	}
	for _, key := range []string{"VmRSS", "VmHWM", "RssAnon"} {
		if figures[key] == 0 {
			b.Fatalf("no %s in /proc/%d/status:\n%s", key, pid, data)
		}
	}
	return figures
}

// fileRss sums the resident file pages of /proc/<pid>/smaps's mappings (Rss less Anonymous: a
// written page of a file's private mapping is anonymous, counted in RssAnon): those of the
// process's own executable, and those of shared libraries (`.so` files), in bytes.
func fileRss(b *testing.B, pid int) (binary, libs float64) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		b.Fatal(err)
	}
	var path string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			// A mapping's header: address range, perms, offset, device, inode[, path].
			path = ""
			if len(fields) >= 6 {
				path = fields[5]
			}
		case len(fields) == 3 && (fields[0] == "Rss:" || fields[0] == "Anonymous:") && fields[2] == "kB":
			kib, err := strconv.ParseFloat(fields[1], 64)
			if err != nil {
				b.Fatalf("%s in /proc/%d/smaps: %v", line, pid, err)
			}
			if fields[0] == "Anonymous:" {
				kib = -kib
			}
			switch {
			case path == exe:
				binary += kib * 1024
			case strings.Contains(path, ".so"):
				libs += kib * 1024
			}
		}
	}
	if binary == 0 {
		b.Fatalf("no resident page of %s in /proc/%d/smaps", exe, pid)
	}
	return binary, libs
}
