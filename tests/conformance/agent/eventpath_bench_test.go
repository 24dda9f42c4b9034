// Benchmark: what the agent adds to a pod's life, beside the floor. The real `resmgr run`
// (nri-only) and a no-op plugin on our own NRI stub (the `scripted` example, quiet, subscribed to
// the same events as the agent) serve containerd's NRI runtime side (pkg/adaptation, a fake
// runtime behind it) in turn, in one run: rounds alternate between the two so that a machine
// busy with something else weighs on both alike. Each round runs pods one after another through
// their whole life (sandbox, CreateContainer, start, stop, removal), each pod's one container
// either Guaranteed with one whole CPU (`fit`: exclusive CPUs, the shared pool shrinks and grows)
// or Burstable (`shared`).
//
// Reported for the agent and for the no-op, and as the agent's ratio over the no-op: the median
// CreateContainer round trip (create-p50), the median pod iteration (iteration-p50), and the
// plugin process's CPU time per iteration (cpu, from /proc/<pid>/stat). The targets are ratios:
// the agent's decision must not cost more than half again what merely being a plugin costs.
package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"

	"github.com/resmgr/resmgr/tests/conformance/internal/rustbin"
)

const (
	// eventPathRounds alternate between the agent and the no-op, this many of each.
	eventPathRounds = 3
	// eventPathPods is how many pods one round takes through their life.
	eventPathPods = 500
	// eventPathEvents are the agent's subscriptions (crates/resmgr/src/nri_plugin), which the
	// no-op subscribes to as well.
	eventPathEvents = "CREATE_CONTAINER,POST_CREATE_CONTAINER,POST_START_CONTAINER,UPDATE_CONTAINER,POST_UPDATE_CONTAINER,STOP_CONTAINER,REMOVE_CONTAINER"
	// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat (100 on Linux).
	clockTicks = 100
)

// round is what one plugin's round measured.
type round struct {
	create, iteration []time.Duration
	cpu               time.Duration
}

func BenchmarkEventPath(b *testing.B) {
	previous := nrilog.Get()
	nrilog.Set(quietLogger{})
	b.Cleanup(func() { nrilog.Set(previous) })
	for _, mix := range []string{"fit", "shared"} {
		b.Run(mix, func(b *testing.B) {
			for range b.N {
				var agent, noop round
				for i := range eventPathRounds {
					agent.add(eventPathRound(b, "resmgr", mix, i))
					noop.add(eventPathRound(b, "noop", mix, i))
				}
				report := func(name string, agentV, noopV time.Duration) {
					b.ReportMetric(float64(agentV.Nanoseconds()), name+"-ns")
					b.ReportMetric(float64(noopV.Nanoseconds()), "noop-"+name+"-ns")
					b.ReportMetric(float64(agentV)/float64(noopV), name+"-x")
				}
				report("create-p50", median(agent.create), median(noop.create))
				report("iteration-p50", median(agent.iteration), median(noop.iteration))
				report("cpu", agent.cpu/time.Duration(len(agent.iteration)), noop.cpu/time.Duration(len(noop.iteration)))
			}
		})
	}
}

func (r *round) add(o round) {
	r.create = append(r.create, o.create...)
	r.iteration = append(r.iteration, o.iteration...)
	r.cpu += o.cpu
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// eventPathRound starts a runtime and plugin `which` ("resmgr" or "noop") on it, takes
// eventPathPods pods of `mix` through their life, and stops both.
func eventPathRound(b *testing.B, which, mix string, n int) round {
	b.Helper()
	dir := b.TempDir()
	active := make(pluginCount, 8)
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	updateFn := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	socket := filepath.Join(dir, "nri.sock")
	r, err := adaptation.New("containerd", "v2.1.0", syncFn, updateFn,
		adaptation.WithSocketPath(socket), adaptation.WithPluginPath(filepath.Join(dir, "nri-plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "nri-conf")), adaptation.WithMetrics(active))
	if err != nil {
		b.Fatalf("adaptation.New: %v", err)
	}
	if err := r.Start(); err != nil {
		b.Fatalf("adaptation.Start: %v", err)
	}

	var cmd *exec.Cmd
	switch which {
	case "resmgr":
		bin, err := rustbin.Path("resmgr")
		if err != nil {
			b.Fatal(err)
		}
		cmd = exec.Command(bin, "run", "--dra", "false",
			"--nri-socket", socket, "--nri-plugin-index", "90",
			"--cdi-dir", filepath.Join(dir, "cdi"), "--state-dir", filepath.Join(dir, "state"),
			"--topology", "synthetic:pack:1 numa:2 core:8 pu:2", "--reserved-cpus", "0",
			"--metrics-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0", "--log-level", "warn")
	case "noop":
		bin, err := rustbin.Path("examples/scripted")
		if err != nil {
			b.Fatal(err)
		}
		cmd = exec.Command(bin, "--socket", socket, "--name", "noop", "--index", "90",
			"--events", eventPathEvents, "--quiet")
	}
	logs := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting %s: %v", which, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The plugin count changes once more as the plugin goes: keep reading it until the runtime
	// is stopped.
	stopped := make(chan struct{})
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
		r.Stop()
		close(stopped)
	}()
	for count := 0; count != 1; {
		select {
		case count = <-active:
		case err := <-exited:
			b.Fatalf("%s exited (%v) before it synchronized:\n%s", which, err, logs.String())
		case <-time.After(waitLimit):
			b.Fatalf("%s never became an active NRI plugin:\n%s", which, logs.String())
		}
	}
	go func() {
		for {
			select {
			case <-active:
			case <-stopped:
				return
			}
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out round
	cpuBefore := cpuTime(b, cmd.Process.Pid)
	for i := range eventPathPods {
		pod, container := eventPathPod(mix, n*eventPathPods+i)
		began := time.Now()
		must := func(what string, err error) {
			if err != nil {
				b.Fatalf("%s of pod %d with %s: %v\n%s", what, i, which, err, logs.String())
			}
		}
		must("RunPodSandbox", r.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}))
		created := time.Now()
		_, err := r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: container})
		must("CreateContainer", err)
		out.create = append(out.create, time.Since(created))
		must("PostCreateContainer", r.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: container}))
		container.State = api.ContainerState_CONTAINER_RUNNING
		must("StartContainer", r.StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: container}))
		must("PostStartContainer", r.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: container}))
		container.State = api.ContainerState_CONTAINER_STOPPED
		_, err = r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: container})
		must("StopContainer", err)
		must("RemoveContainer", r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: container}))
		must("StopPodSandbox", r.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod}))
		must("RemovePodSandbox", r.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod}))
		out.iteration = append(out.iteration, time.Since(began))
	}
	out.cpu = cpuTime(b, cmd.Process.Pid) - cpuBefore
	return out
}

// eventPathPod is pod i of `mix` with one container, as the kubelet creates them
// (kubeletContainer), Guaranteed with one CPU for `fit` and Burstable for `shared`.
func eventPathPod(mix string, i int) (*api.PodSandbox, *api.Container) {
	// kubeletContainer makes every tenth pod Guaranteed, with one CPU, and every other but the
	// BestEffort tenth Burstable.
	n := i * 10
	if mix == "shared" {
		n += 2
	}
	pod, container := kubeletContainer(n)
	pod.Name, pod.Uid = fmt.Sprintf("%s-%d", mix, i), fmt.Sprintf("e7e70000-0000-4000-8000-%012d", n)
	pod.Id, container.Id, container.PodSandboxId = "sb-"+pod.Uid, "ctr-"+pod.Uid, "sb-"+pod.Uid
	container.State = api.ContainerState_CONTAINER_CREATED
	return pod, container
}

// cpuTime is the user and system CPU time process pid has used.
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from after it.
	rest := string(data)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	fields := strings.Fields(rest)
	// utime and stime are fields 14 and 15 of the line, 12 and 13 after the command name.
	if len(fields) < 13 {
		b.Fatalf("/proc/%d/stat has %d fields after the command: %q", pid, len(fields), data)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		t, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat field %q: %v", pid, f, err)
		}
		ticks += t
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
