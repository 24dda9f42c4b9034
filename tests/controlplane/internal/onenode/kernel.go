package onenode

import (
	"bytes"
	"errors"
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
	var base hierarchy
	found := false
	for _, h := range n.st.Hierarchies {
		if (!h.V2 && h.has("cpuset")) || (h.V2 && onlyUnified(n.st.Hierarchies)) {
			base, found = h, true
		}
	}
	if !found {
		return Placement{}, errors.New("no cpuset hierarchy")
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
		return Placement{}, fmt.Errorf("no cgroup of container %s under %s", containerID, filepath.Join(base.Mount, n.st.CgroupRoot))
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
