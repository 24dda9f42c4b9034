package onenode

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Placement is where the kernel runs a container: its cgroup's cpuset and, for each of its
// processes, /proc/<pid>/status's allowed lists and the environment.
type Placement struct {
	Cgroup     string
	CgroupCPUs string
	CgroupMems string
	Processes  []Process
}

// Process is one process of a container as the kernel sees it.
type Process struct {
	PID         int
	CPUsAllowed string
	MemsAllowed string
	Env         map[string]string
}

// Placement reads a container's placement (containerID without the runtime's prefix) from its
// cgroup, found under the run's cgroup root where the kubelet's cgroupfs driver puts it.
func (n *Node) Placement(containerID string) (Placement, error) {
	base, dir, err := n.containerCgroup("cpuset", containerID)
	if err != nil {
		return Placement{}, err
	}
	p := Placement{Cgroup: dir}
	prefix := "cpuset."
	if base.V2 {
		prefix = "cpuset.effective_" // v2 has no cpuset.cpus of its own unless set
		if data, err := os.ReadFile(filepath.Join(dir, "cpuset.cpus")); err == nil && len(bytes.TrimSpace(data)) > 0 {
			prefix = "cpuset."
		}
	}
	for file, to := range map[string]*string{prefix + "cpus": &p.CgroupCPUs, prefix + "mems": &p.CgroupMems} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return p, err
		}
		*to = strings.TrimSpace(string(data))
	}
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return p, err
	}
	for _, field := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(field)
		if err != nil {
			continue
		}
		proc, err := readProcess(pid)
		if err != nil {
			continue // it exited meanwhile
		}
		p.Processes = append(p.Processes, proc)
	}
	if len(p.Processes) == 0 {
		return p, fmt.Errorf("container %s has no process in %s", containerID, dir)
	}
	return p, nil
}

// containerCgroup is the hierarchy of a controller (the unified one on cgroup v2) and a
// container's cgroup in it, under the run's cgroup root where the kubelet's cgroupfs driver
// puts it.
func (n *Node) containerCgroup(controller, containerID string) (hierarchy, string, error) {
	var base hierarchy
	found := false
	for _, h := range n.st.Hierarchies {
		if (!h.V2 && h.has(controller)) || (h.V2 && onlyUnified(n.st.Hierarchies)) {
			base, found = h, true
		}
	}
	if !found {
		return base, "", fmt.Errorf("no %s hierarchy", controller)
	}
	var dir string
	_ = filepath.WalkDir(filepath.Join(base.Mount, n.st.CgroupRoot), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == containerID {
			dir = path
			return filepath.SkipAll
		}
		return nil
	})
	if dir == "" {
		return base, "", fmt.Errorf("no %s cgroup of container %s under %s", controller, containerID, filepath.Join(base.Mount, n.st.CgroupRoot))
	}
	return base, dir, nil
}

// CPULimit is a container's CPU bandwidth limit in the kernel, "<quota> <period>" in
// microseconds as cgroup v2's cpu.max says it ("max <period>" without a limit), read from v1's
// cpu.cfs_quota_us and cpu.cfs_period_us where that is the hierarchy.
func (n *Node) CPULimit(containerID string) (string, error) {
	base, dir, err := n.containerCgroup("cpu", containerID)
	if err != nil {
		return "", err
	}
	read := func(file string) (string, error) {
		data, err := os.ReadFile(filepath.Join(dir, file))
		return strings.TrimSpace(string(data)), err
	}
	if base.V2 {
		return read("cpu.max")
	}
	quota, err := read("cpu.cfs_quota_us")
	if err != nil {
		return "", err
	}
	period, err := read("cpu.cfs_period_us")
	if err != nil {
		return "", err
	}
	if quota == "-1" {
		quota = "max"
	}
	return quota + " " + period, nil
}

func readProcess(pid int) (Process, error) {
	p := Process{PID: pid, Env: map[string]string{}}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return p, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch key {
		case "Cpus_allowed_list":
			p.CPUsAllowed = strings.TrimSpace(value)
		case "Mems_allowed_list":
			p.MemsAllowed = strings.TrimSpace(value)
		}
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return p, err
	}
	for _, kv := range bytes.Split(env, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			p.Env[k] = v
		}
	}
	return p, nil
}
