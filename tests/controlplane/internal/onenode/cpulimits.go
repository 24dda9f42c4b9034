package onenode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CPULimits is what a cgroup's cpu controller gives its processes, in cgroup v1's terms (a v2
// cgroup's cpu.max and cpu.weight are read into them).
type CPULimits struct {
	Cgroup string
	// Quota is the CPU time in microseconds its processes may use per Period; -1 is no limit.
	Quota, Period int64
	// Shares is cpu.shares (v1). On v2 it is 0 and Weight is cpu.weight.
	Shares, Weight int64
}

// CPULimits reads the cpu controller's limits of a container's cgroup (containerID without the
// runtime's prefix) and of its parent, the pod's cgroup.
func (n *Node) CPULimits(containerID string) (container, pod CPULimits, err error) {
	base, dir, err := n.containerCgroup("cpu", containerID)
	if err != nil {
		return container, pod, err
	}
	if container, err = readCPULimits(dir, base.V2); err != nil {
		return container, pod, err
	}
	pod, err = readCPULimits(filepath.Dir(dir), base.V2)
	return container, pod, err
}

func readCPULimits(dir string, v2 bool) (CPULimits, error) {
	l := CPULimits{Cgroup: dir}
	read := func(name string) (string, error) {
		data, err := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(data)), err
	}
	number := func(name, text string) (int64, error) {
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s in %s: %w", name, dir, err)
		}
		return v, nil
	}
	if v2 {
		max, err := read("cpu.max")
		if err != nil {
			return l, err
		}
		quota, period, ok := strings.Cut(max, " ")
		if !ok {
			return l, fmt.Errorf("cpu.max in %s is %q", dir, max)
		}
		l.Quota = -1
		if quota != "max" {
			if l.Quota, err = number("cpu.max", quota); err != nil {
				return l, err
			}
		}
		if l.Period, err = number("cpu.max", period); err != nil {
			return l, err
		}
		weight, err := read("cpu.weight")
		if err != nil {
			return l, err
		}
		l.Weight, err = number("cpu.weight", weight)
		return l, err
	}
	for name, to := range map[string]*int64{"cpu.cfs_quota_us": &l.Quota, "cpu.cfs_period_us": &l.Period, "cpu.shares": &l.Shares} {
		text, err := read(name)
		if err != nil {
			return l, err
		}
		if *to, err = number(name, text); err != nil {
			return l, err
		}
	}
	return l, nil
}
