package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
)

// containerRuntime is the node's container runtime as the kubelet and the agent meet it.
type containerRuntime interface {
	// nriSocket is where the agent connects as an NRI plugin; cdiDir where it writes CDI specs.
	nriSocket() string
	cdiDir() string
	// waitPlugin waits until the runtime counts the agent as a synchronized plugin, or the
	// agent exits (exited is closed).
	waitPlugin(exited <-chan struct{}) error
	// createContainer runs the pod's sandbox if needed, then creates and starts the container
	// with the CDI devices of its claims, which the runtime injects.
	createContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, cdiDevices []string) (Container, error)
	// removePod stops and removes the pod's containers and sandbox.
	removePod(ctx context.Context, pod *corev1.Pod) error
	// cpusets is every running container's current cpus, by container ID.
	cpusets() map[string]string
}

// nriRuntime is containerd's NRI side (the adaptation library, as containerd embeds it) with a
// table of the containers it has created and the CDI injection runtimes do (the CDI cache),
// standing in for a container runtime where the e2e's containerd cannot run.
type nriRuntime struct {
	dir string
	nri *adaptation.Adaptation
	// active receives the adaptation's plugin count: a plugin counts after its Synchronize.
	active chan int

	mu         sync.Mutex
	pods       map[string]*api.PodSandbox
	containers map[string]*api.Container
	// updates are the container updates the agent pushed, in order.
	updates []*api.ContainerUpdate
}

// metrics only watches the plugin count.
type metrics chan int

func (metrics) RecordPluginInvocation(string, string, error)                               {}
func (metrics) RecordPluginLatency(string, string, time.Duration)                          {}
func (metrics) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {}
func (m metrics) UpdatePluginCount(n int) {
	select {
	case m <- n:
	default:
	}
}

func startNRIRuntime(t testing.TB, dir string) *nriRuntime {
	t.Helper()
	// The adaptation logs through containerd's global logger: into the node's directory, kept
	// when the test fails, instead of between the test's own messages.
	out, err := os.Create(filepath.Join(dir, "nri-runtime.log"))
	if err != nil {
		t.Fatal(err)
	}
	log.L.Logger.SetOutput(out)
	t.Cleanup(func() { log.L.Logger.SetOutput(os.Stderr); out.Close() })
	r := &nriRuntime{dir: dir, active: make(chan int, 16), pods: map[string]*api.PodSandbox{}, containers: map[string]*api.Container{}}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		r.mu.Lock()
		var pods []*api.PodSandbox
		var containers []*api.Container
		for _, p := range r.pods {
			pods = append(pods, p)
		}
		for _, c := range r.containers {
			containers = append(containers, c)
		}
		r.mu.Unlock()
		updates, err := cb(ctx, pods, containers)
		r.apply(updates)
		return err
	}
	updateFn := func(_ context.Context, u []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		r.apply(u)
		return nil, nil
	}
	nri, err := adaptation.New("containerd", "v2.1.0", syncFn, updateFn,
		adaptation.WithSocketPath(filepath.Join(dir, "nri.sock")),
		adaptation.WithPluginPath(filepath.Join(dir, "nri-plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "nri-conf")),
		adaptation.WithMetrics(metrics(r.active)))
	if err != nil {
		t.Fatalf("adaptation.New: %v", err)
	}
	if err := nri.Start(); err != nil {
		t.Fatalf("adaptation.Start: %v", err)
	}
	t.Cleanup(nri.Stop)
	r.nri = nri
	return r
}

// apply records updates and applies their cpusets to the container table.
func (r *nriRuntime) apply(updates []*api.ContainerUpdate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range updates {
		r.updates = append(r.updates, u)
		c := r.containers[u.ContainerId]
		cpu := u.GetLinux().GetResources().GetCpu()
		if c == nil || cpu == nil {
			continue
		}
		if cpu.Cpus != "" {
			c.Linux.Resources.Cpu.Cpus = cpu.Cpus
		}
		if cpu.Mems != "" {
			c.Linux.Resources.Cpu.Mems = cpu.Mems
		}
	}
}

// The kubelet's arithmetic from a container's requests and limits to cgroup values
// (pkg/kubelet/cm: shares, CFS quota over a 100 ms period, memory limit), and its pod cgroup
// naming (systemd driver), which is how the runtime, and so NRI, see a pod's QoS class.
const cfsPeriod = 100000

func qosClass(pod *corev1.Pod) string {
	if pod.Status.QOSClass != "" {
		return strings.ToLower(string(pod.Status.QOSClass))
	}
	return "burstable"
}

func cgroupParent(pod *corev1.Pod) string {
	uid := strings.ReplaceAll(string(pod.UID), "-", "_")
	switch qos := qosClass(pod); qos {
	case "guaranteed":
		return "kubepods-pod" + uid + ".slice"
	default:
		return "kubepods-" + qos + "-pod" + uid + ".slice"
	}
}

func linuxResources(c *corev1.Container) *api.LinuxResources {
	milli := c.Resources.Requests.Cpu().MilliValue()
	shares := uint64(2)
	if milli > 0 {
		shares = max(uint64(milli)*1024/1000, 2)
	}
	res := &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: &api.OptionalUInt64{Value: shares}}}
	if lim := c.Resources.Limits.Cpu().MilliValue(); lim > 0 {
		res.Cpu.Quota = &api.OptionalInt64{Value: lim * cfsPeriod / 1000}
		res.Cpu.Period = &api.OptionalUInt64{Value: cfsPeriod}
	}
	if mem := c.Resources.Limits.Memory().Value(); mem > 0 {
		res.Memory = &api.LinuxMemory{Limit: &api.OptionalInt64{Value: mem}}
	}
	return res
}

func sandbox(pod *corev1.Pod) *api.PodSandbox {
	return &api.PodSandbox{Id: "sb-" + string(pod.UID), Name: pod.Name, Uid: string(pod.UID),
		Namespace: pod.Namespace, Linux: &api.LinuxPodSandbox{CgroupParent: cgroupParent(pod)}}
}

func (r *nriRuntime) nriSocket() string { return filepath.Join(r.dir, "nri.sock") }
func (r *nriRuntime) cdiDir() string    { return filepath.Join(r.dir, "cdi") }

func (r *nriRuntime) waitPlugin(exited <-chan struct{}) error {
	deadline := time.After(cluster.WaitLimit)
	for {
		select {
		case c := <-r.active:
			if c >= 1 {
				return nil
			}
		case <-exited:
			return fmt.Errorf("it exited before it synchronized with the runtime")
		case <-deadline:
			return fmt.Errorf("it never became an active NRI plugin")
		}
	}
}

// createContainer runs the runtime's CreateContainer for the pod's container (RunPodSandbox
// first for a new pod), with the environment its CDI devices inject, and records the container
// with the cpuset the plugins chose.
func (r *nriRuntime) createContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, cdiDevices []string) (Container, error) {
	env, err := r.inject(cdiDevices)
	if err != nil {
		return Container{}, err
	}
	ctr, err := r.create(ctx, pod, c, env, cdiDevices)
	if err != nil {
		return Container{}, err
	}
	cpu := ctr.GetLinux().GetResources().GetCpu()
	return Container{ID: ctr.Id, Cpus: cpu.GetCpus(), Mems: cpu.GetMems(), Env: env}, nil
}

// inject resolves CDI devices from the agent's spec directory with the CDI cache runtimes use,
// and returns the environment they inject.
func (r *nriRuntime) inject(devices []string) ([]string, error) {
	if len(devices) == 0 {
		return nil, nil
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(r.cdiDir()), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache: %w", err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if _, err := cache.InjectDevices(spec, devices...); err != nil {
		return nil, fmt.Errorf("injecting %v: %w", devices, err)
	}
	return spec.Process.Env, nil
}

// create is the runtime's RunPodSandbox (for a new pod), CreateContainer, StartContainer and
// PostStartContainer.
func (r *nriRuntime) create(ctx context.Context, pod *corev1.Pod, c *corev1.Container, env []string, cdiDevices []string) (*api.Container, error) {
	sb := sandbox(pod)
	r.mu.Lock()
	_, known := r.pods[sb.Id]
	r.mu.Unlock()
	if !known {
		if err := r.nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: sb}); err != nil {
			return nil, fmt.Errorf("RunPodSandbox %s: %w", pod.Name, err)
		}
		r.mu.Lock()
		r.pods[sb.Id] = sb
		r.mu.Unlock()
	}
	ctr := &api.Container{Id: sb.Id + "-" + c.Name, PodSandboxId: sb.Id, Name: c.Name, Env: env,
		State: api.ContainerState_CONTAINER_CREATED, Linux: &api.LinuxContainer{Resources: linuxResources(c)}}
	for _, d := range cdiDevices {
		ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: d})
	}
	resp, err := r.nri.CreateContainer(ctx, &api.CreateContainerRequest{Pod: sb, Container: ctr})
	if err != nil {
		return nil, fmt.Errorf("CreateContainer %s/%s: %w", pod.Name, c.Name, err)
	}
	if cpu := resp.GetAdjust().GetLinux().GetResources().GetCpu(); cpu != nil {
		if cpu.Cpus != "" {
			ctr.Linux.Resources.Cpu.Cpus = cpu.Cpus
		}
		if cpu.Mems != "" {
			ctr.Linux.Resources.Cpu.Mems = cpu.Mems
		}
	}
	r.apply(resp.GetUpdate())
	ctr.State = api.ContainerState_CONTAINER_RUNNING
	r.mu.Lock()
	r.containers[ctr.Id] = ctr
	r.mu.Unlock()
	if err := r.nri.StartContainer(ctx, &api.StartContainerRequest{Pod: sb, Container: ctr}); err != nil {
		return nil, fmt.Errorf("StartContainer %s/%s: %w", pod.Name, c.Name, err)
	}
	// containerd's PostStartContainer once the task runs: the agent holds a container's
	// updates until then.
	if err := r.nri.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: sb, Container: ctr}); err != nil {
		return nil, fmt.Errorf("PostStartContainer %s/%s: %w", pod.Name, c.Name, err)
	}
	return ctr, nil
}

// removePod stops and removes the pod's containers and its sandbox.
func (r *nriRuntime) removePod(ctx context.Context, pod *corev1.Pod) error {
	sb := sandbox(pod)
	r.mu.Lock()
	var mine []*api.Container
	for id, c := range r.containers {
		if c.PodSandboxId == sb.Id {
			mine = append(mine, c)
			delete(r.containers, id)
		}
	}
	_, known := r.pods[sb.Id]
	delete(r.pods, sb.Id)
	r.mu.Unlock()
	for _, c := range mine {
		resp, err := r.nri.StopContainer(ctx, &api.StopContainerRequest{Pod: sb, Container: c})
		if err != nil {
			return fmt.Errorf("StopContainer %s: %w", c.Id, err)
		}
		r.apply(resp.GetUpdate())
		if err := r.nri.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: sb, Container: c}); err != nil {
			return fmt.Errorf("RemoveContainer %s: %w", c.Id, err)
		}
	}
	if !known {
		return nil
	}
	if err := r.nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: sb}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", pod.Name, err)
	}
	return r.nri.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: sb})
}

// cpusets is every running container's cpuset, by container ID.
func (r *nriRuntime) cpusets() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for id, c := range r.containers {
		out[id] = c.GetLinux().GetResources().GetCpu().GetCpus()
	}
	return out
}
