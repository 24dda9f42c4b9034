package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// RealRuntime is the real runtime (CRI-O, or containerd) that an e2e runtime stage brings up
// and hands to a command (`e2e ... -- COMMAND`) in RESMGR_E2E_* variables: its CRI endpoint
// with crictl and a configuration for it, the NRI socket the agent plugs into, the CDI
// directory the runtime reads, the test image, and the run's cgroup root.
type RealRuntime struct {
	Crictl, CrictlConfig string
	NRISocket, CDIDir    string
	Image, CgroupRoot    string
}

// RealRuntimeFromEnv reads the node an e2e runtime stage describes, failing the test with what
// to do when the variables are missing.
func RealRuntimeFromEnv(t testing.TB) *RealRuntime {
	t.Helper()
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			t.Fatalf("%s is not set: this test runs on the e2e's CRI-O, through "+
				"`cargo xtask e2e --stage controlplane` as root", name)
		}
		return v
	}
	return &RealRuntime{
		Crictl: get("RESMGR_E2E_CRICTL"), CrictlConfig: get("RESMGR_E2E_CRICTL_CONFIG"),
		NRISocket: get("RESMGR_E2E_NRI_SOCKET"), CDIDir: get("RESMGR_E2E_CDI_DIR"),
		Image: get("RESMGR_E2E_IMAGE"), CgroupRoot: get("RESMGR_E2E_CGROUP_ROOT"),
	}
}

// criRuntime is the kubelet's CRI side against a real runtime, through crictl: pod sandboxes with
// the kubelet's cgroup parents (cgroupfs driver), containers with the kubelet's resources and
// the claims' CDI devices, which containerd itself injects. Containers are read back from the
// kernel.
type criRuntime struct {
	c   *RealRuntime
	dir string

	mu sync.Mutex
	// sandboxes maps a pod UID to its sandbox ID.
	sandboxes map[string]string
	// pids maps a container ID to its process; owners to its pod's UID.
	pids, owners map[string]string
}

func newCRIRuntime(t testing.TB, c *RealRuntime, dir string) *criRuntime {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "cri"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &criRuntime{c: c, dir: filepath.Join(dir, "cri"), sandboxes: map[string]string{},
		pids: map[string]string{}, owners: map[string]string{}}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for uid, id := range r.sandboxes {
			if _, err := r.crictl("stopp", id); err == nil {
				_, _ = r.crictl("rmp", id)
			}
			delete(r.sandboxes, uid)
		}
	})
	return r
}

func (r *criRuntime) nriSocket() string { return r.c.NRISocket }
func (r *criRuntime) cdiDir() string    { return r.c.CDIDir }

// waitPlugin: containerd does not say when a plugin has synchronized; the agent's /readyz does.
func (r *criRuntime) waitPlugin(<-chan struct{}) error { return nil }

func (r *criRuntime) crictl(args ...string) (string, error) {
	out, err := exec.Command(r.c.Crictl, append([]string{"--config", r.c.CrictlConfig}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

func (r *criRuntime) cgroupParent(pod *corev1.Pod) string {
	switch qos := qosClass(pod); qos {
	case "guaranteed":
		return r.c.CgroupRoot + "/pod" + string(pod.UID)
	default:
		return r.c.CgroupRoot + "/" + qos + "/pod" + string(pod.UID)
	}
}

func (r *criRuntime) writeJSON(name string, v any) (string, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	path := filepath.Join(r.dir, name)
	return path, os.WriteFile(path, data, 0o644)
}

// namespaceOptions are every pod's namespaces. NODE (2): the host's network, so no CNI is
// needed. CONTAINER (1): a PID namespace per container, the kubelet's default (no
// shareProcessNamespace); CRI-O then runs no infra container for the pod.
var namespaceOptions = map[string]any{"network": 2, "pid": 1}

func (r *criRuntime) podConfig(pod *corev1.Pod) (string, error) {
	return r.writeJSON("pod-"+pod.Name+".json", map[string]any{
		"metadata":      map[string]any{"name": pod.Name, "namespace": pod.Namespace, "uid": string(pod.UID), "attempt": 0},
		"log_directory": filepath.Join(r.dir, "logs-"+pod.Name),
		"linux": map[string]any{
			"cgroup_parent":    r.cgroupParent(pod),
			"security_context": map[string]any{"namespace_options": namespaceOptions},
		},
	})
}

// createContainer runs the pod's sandbox if it has none yet, then creates and starts the
// container with the kubelet's cgroup values and the CDI devices, and reads it back from the
// kernel. Its command is sleep itself (no shell), so its environment is what containerd gave it.
func (r *criRuntime) createContainer(_ context.Context, pod *corev1.Pod, c *corev1.Container, cdiDevices []string) (Container, error) {
	podConfig, err := r.podConfig(pod)
	if err != nil {
		return Container{}, err
	}
	r.mu.Lock()
	sandbox, ok := r.sandboxes[string(pod.UID)]
	r.mu.Unlock()
	if !ok {
		if sandbox, err = r.crictl("runp", podConfig); err != nil {
			return Container{}, err
		}
		r.mu.Lock()
		r.sandboxes[string(pod.UID)] = sandbox
		r.mu.Unlock()
	}
	res := linuxResources(c)
	resources := map[string]any{"cpu_shares": res.Cpu.Shares.Value}
	if res.Cpu.Quota != nil {
		resources["cpu_period"], resources["cpu_quota"] = res.Cpu.Period.Value, res.Cpu.Quota.Value
	}
	if res.Memory != nil {
		resources["memory_limit_in_bytes"] = res.Memory.Limit.Value
	}
	config := map[string]any{
		"metadata": map[string]any{"name": c.Name},
		"image":    map[string]any{"image": r.c.Image},
		"command":  []string{"/bin/sleep", "2147483647"},
		"log_path": c.Name + ".log",
		"linux": map[string]any{"resources": resources,
			// The pod's namespaces, as the kubelet repeats them for each container.
			"security_context": map[string]any{"namespace_options": namespaceOptions}},
	}
	if len(cdiDevices) > 0 {
		var devices []map[string]string
		for _, d := range cdiDevices {
			devices = append(devices, map[string]string{"name": d})
		}
		config["CDI_devices"] = devices
	}
	containerConfig, err := r.writeJSON("container-"+pod.Name+"-"+c.Name+".json", config)
	if err != nil {
		return Container{}, err
	}
	id, err := r.crictl("create", sandbox, containerConfig, podConfig)
	if err != nil {
		return Container{}, err
	}
	if _, err := r.crictl("start", id); err != nil {
		return Container{}, err
	}
	out, err := r.crictl("inspect", "-o", "go-template", "--template", "{{.info.pid}}", id)
	if err != nil {
		return Container{}, err
	}
	pid, err := strconv.Atoi(out)
	if err != nil {
		return Container{}, fmt.Errorf("crictl inspect %s gave pid %q", id, out)
	}
	r.mu.Lock()
	r.pids[id], r.owners[id] = out, string(pod.UID)
	r.mu.Unlock()
	ctr := Container{ID: id, PID: pid}
	if ctr.Env, err = environOf(pid); err != nil {
		return ctr, err
	}
	v, err := viewOf(pid)
	if err != nil {
		return ctr, err
	}
	if v.cgroupCpus != v.allowedCpus {
		return ctr, fmt.Errorf("container %s: cgroup cpuset.cpus %q, yet the kernel lets it run on %q", id, v.cgroupCpus, v.allowedCpus)
	}
	ctr.Cpus, ctr.Mems = v.allowedCpus, v.cgroupMems
	return ctr, nil
}

// removePod stops and removes the pod's sandbox and its containers.
func (r *criRuntime) removePod(_ context.Context, pod *corev1.Pod) error {
	r.mu.Lock()
	sandbox, ok := r.sandboxes[string(pod.UID)]
	delete(r.sandboxes, string(pod.UID))
	for id, owner := range r.owners {
		if owner == string(pod.UID) {
			delete(r.pids, id)
			delete(r.owners, id)
		}
	}
	r.mu.Unlock()
	if !ok {
		return nil
	}
	if _, err := r.crictl("stopp", sandbox); err != nil {
		return err
	}
	_, err := r.crictl("rmp", sandbox)
	return err
}

// cpusets is every running container's cpus, as the kernel lets its process run.
func (r *criRuntime) cpusets() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for id, pid := range r.pids {
		n, _ := strconv.Atoi(pid)
		if v, err := viewOf(n); err == nil {
			out[id] = v.allowedCpus
		}
	}
	return out
}
