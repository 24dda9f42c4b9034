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
	Name        string
	CPUsAllowed string
	MemsAllowed string
	Env         map[string]string
	// PIDNamespace is its PID namespace (the link /proc/<pid>/ns/pid), NSPID its PID in each
	// namespace from the host's down (the last is its PID in its own).
	PIDNamespace string
	NSPID        []int
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

// PodCgroups are the processes of each cgroup of a pod (the cpuset hierarchy's), found from
// one of its containers (containerID without the runtime's prefix), by cgroup name: its
// containers', and what the runtime runs for the pod besides (containerd's pause container,
// CRI-O's infra container when the pod has one and each container's conmon). A cgroup without
// processes is left out.
func (n *Node) PodCgroups(containerID string) (map[string][]Process, error) {
	_, dir, err := n.containerCgroup("cpuset", containerID)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Dir(dir))
	if err != nil {
		return nil, err
	}
	out := map[string][]Process{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(filepath.Dir(dir), e.Name(), "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, field := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(field)
			if err != nil {
				continue
			}
			if proc, err := readProcess(pid); err == nil {
				out[e.Name()] = append(out[e.Name()], proc)
			}
		}
	}
	return out, nil
}

// ContainerCgroupName is the name the node's runtime gives a container's cgroup.
func (n *Node) ContainerCgroupName(containerID string) string { return n.rt.cgroupName(containerID) }

// NRISocket is the runtime's NRI socket, which the agent plugs into.
func (n *Node) NRISocket() string { return n.l.at("nri/nri.sock") }

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
	dir, err := findCgroup(filepath.Join(base.Mount, n.st.CgroupRoot), n.rt.cgroupName(containerID))
	if err != nil {
		return base, "", fmt.Errorf("%s: %w", controller, err)
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
		case "Name":
			p.Name = strings.TrimSpace(value)
		case "NSpid":
			for _, f := range strings.Fields(value) {
				if id, err := strconv.Atoi(f); err == nil {
					p.NSPID = append(p.NSPID, id)
				}
			}
		case "Cpus_allowed_list":
			p.CPUsAllowed = strings.TrimSpace(value)
		case "Mems_allowed_list":
			p.MemsAllowed = strings.TrimSpace(value)
		}
	}
	p.PIDNamespace, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
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

// MemoryLimits is what a cgroup's memory and hugetlb controllers hold its processes to, in
// bytes; -1 is no limit.
type MemoryLimits struct {
	MemoryCgroup, HugetlbCgroup string
	Memory, Hugetlb2M           int64
}

// MemoryLimits reads the memory limit and the 2 MiB hugetlb limit of a container's cgroup
// (containerID without the runtime's prefix) and of its parent, the pod's cgroup: cgroup v1's
// memory.limit_in_bytes and hugetlb.2MB.limit_in_bytes, v2's memory.max and hugetlb.2MB.max.
func (n *Node) MemoryLimits(containerID string) (container, pod MemoryLimits, err error) {
	base, memDir, err := n.containerCgroup("memory", containerID)
	if err != nil {
		return container, pod, err
	}
	hugetlb, err := n.hugetlbMount()
	if err != nil {
		return container, pod, err
	}
	hugeDir, err := findCgroup(filepath.Join(hugetlb, n.st.CgroupRoot), n.rt.cgroupName(containerID))
	if err != nil {
		return container, pod, fmt.Errorf("hugetlb: %w", err)
	}
	memFile, hugeFile := "memory.limit_in_bytes", "hugetlb.2MB.limit_in_bytes"
	if base.V2 {
		memFile, hugeFile = "memory.max", "hugetlb.2MB.max"
	}
	read := func(dir, hugeDir string) (MemoryLimits, error) {
		l := MemoryLimits{MemoryCgroup: dir, HugetlbCgroup: hugeDir}
		var err error
		if l.Memory, err = readLimit(filepath.Join(dir, memFile)); err != nil {
			return l, err
		}
		l.Hugetlb2M, err = readLimit(filepath.Join(hugeDir, hugeFile))
		return l, err
	}
	if container, err = read(memDir, hugeDir); err != nil {
		return container, pod, err
	}
	pod, err = read(filepath.Dir(memDir), filepath.Dir(hugeDir))
	return container, pod, err
}

// unlimitedV1 is where cgroup v1 puts a limit that is not set (PAGE_COUNTER_MAX pages of 4 KiB,
// rounded down to a page): anything above it is no limit.
const unlimitedV1 = int64(1) << 62

// readLimit reads a limit in bytes; -1 for none ("max" on v2, the largest value on v1).
func readLimit(file string) (int64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	text := strings.TrimSpace(string(data))
	if text == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a limit in bytes", file, text)
	}
	if v >= unlimitedV1 {
		return -1, nil
	}
	return v, nil
}

// findCgroup finds the cgroup named name (a container's, as its runtime names it) below root.
func findCgroup(root, name string) (string, error) {
	var dir string
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == name {
			dir = path
			return filepath.SkipAll
		}
		return nil
	})
	if dir == "" {
		return "", fmt.Errorf("no cgroup %s under %s", name, root)
	}
	return dir, nil
}
