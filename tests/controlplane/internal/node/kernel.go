package node

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// kernelView is what the kernel says a process may run on: its cpuset cgroup's cpuset.cpus and
// cpuset.mems, and the Cpus_allowed_list and Mems_allowed_list of /proc/<pid>/status. This,
// not what the agent or the runtime say, is what a container on a real runtime is checked by.
type kernelView struct {
	cgroupCpus, cgroupMems   string
	allowedCpus, allowedMems string
}

// cpusetMount is where the cpuset controller's hierarchy is mounted, and whether it is v2.
func cpusetMount() (string, bool, error) {
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", false, err
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[2] == "cgroup" && hasItem(f[3], "cpuset") {
			return f[1], false, nil
		}
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "cgroup2" {
			controllers, _ := os.ReadFile(filepath.Join(f[1], "cgroup.controllers"))
			if hasWord(string(controllers), "cpuset") {
				return f[1], true, nil
			}
		}
	}
	return "", false, fmt.Errorf("no cgroup hierarchy has the cpuset controller")
}

func hasItem(list, item string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == item {
			return true
		}
	}
	return false
}

func hasWord(text, word string) bool {
	for _, x := range strings.Fields(text) {
		if x == word {
			return true
		}
	}
	return false
}

// viewOf reads the kernel's view of pid.
func viewOf(pid int) (kernelView, error) {
	var v kernelView
	mount, v2, err := cpusetMount()
	if err != nil {
		return v, err
	}
	cgroups, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return v, err
	}
	dir := ""
	for _, line := range strings.Split(strings.TrimSpace(string(cgroups)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[1] == "" || !v2 && hasItem(parts[1], "cpuset") {
			dir = filepath.Join(mount, parts[2])
		}
	}
	if dir == "" {
		return v, fmt.Errorf("process %d is in no cpuset cgroup: %s", pid, cgroups)
	}
	read := func(path string) (string, error) {
		data, err := os.ReadFile(path)
		return strings.TrimSpace(string(data)), err
	}
	cpusFile, memsFile := "cpuset.cpus", "cpuset.mems"
	if v2 {
		cpusFile, memsFile = "cpuset.cpus.effective", "cpuset.mems.effective"
	}
	if v.cgroupCpus, err = read(filepath.Join(dir, cpusFile)); err != nil {
		return v, err
	}
	if v.cgroupMems, err = read(filepath.Join(dir, memsFile)); err != nil {
		return v, err
	}
	status, err := read(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return v, err
	}
	for _, line := range strings.Split(status, "\n") {
		if value, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			v.allowedCpus = strings.TrimSpace(value)
		}
		if value, ok := strings.CutPrefix(line, "Mems_allowed_list:"); ok {
			v.allowedMems = strings.TrimSpace(value)
		}
	}
	return v, nil
}

// environOf is the environment pid was started with.
func environOf(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range bytes.Split(data, []byte{0}) {
		if len(e) > 0 {
			out = append(out, string(e))
		}
	}
	return out, nil
}

// OnlineCPUs is the machine's online cpu list, as sysfs says.
func OnlineCPUs() (string, error) {
	data, err := os.ReadFile("/sys/devices/system/cpu/online")
	return strings.TrimSpace(string(data)), err
}
