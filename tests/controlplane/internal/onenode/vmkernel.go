package onenode

// What the guest's kernel and systemd say about a container of a VM node: its cgroup v2 files
// (where the systemd driver puts it: a scope under the pod's slice) and /proc/<pid>/status of
// each of its processes, read over ssh in one go.

import (
	"fmt"
	"strings"
)

// GuestCgroup is a container's cgroup in the guest and its pod's, as cgroup v2 has them.
type GuestCgroup struct {
	// Path is the container's cgroup directory; Unit its systemd unit (the scope).
	Path, Unit string
	// Files are the container's cgroup files read (cpuset.cpus.effective, cpuset.mems.effective,
	// hugetlb.2MB.max, memory.min, memory.high, memory.max), Pod the same of its pod's cgroup.
	Files, Pod map[string]string
	// Systemd is what systemd holds for the unit (AllowedCPUs, AllowedMemoryNodes,
	// MemoryMin, MemoryHigh), which it applies again on a daemon-reload.
	Systemd map[string]string
	// Processes are the container's processes, with /proc/<pid>/status's allowed lists.
	Processes []Process
}

// guestCgroupFiles are the cgroup files GuestCgroup reads.
var guestCgroupFiles = []string{"cpuset.cpus.effective", "cpuset.mems.effective", "hugetlb.2MB.max",
	"memory.min", "memory.high", "memory.max"}

// GuestCgroup reads a container's cgroup (containerID without the runtime's prefix) in the
// guest.
func (n *Node) GuestCgroup(containerID string) (GuestCgroup, error) {
	if n.vm == nil {
		return GuestCgroup{}, fmt.Errorf("the node is not a VM")
	}
	// The systemd driver names a container's scope after the runtime: cri-containerd-<ID>,
	// crio-<ID> (CRI-O's conmon has crio-conmon-<ID>).
	name := "cri-containerd-" + containerID + ".scope"
	if n.cfg.Runtime == CRIO {
		name = "crio-" + containerID + ".scope"
	}
	script := fmt.Sprintf(`set -e
d=$(find /sys/fs/cgroup/kubepods.slice -type d -name %[1]s | head -n 1)
[ -n "$d" ] || { echo "no cgroup %[1]s under /sys/fs/cgroup/kubepods.slice" >&2; exit 1; }
echo "path $d"
for f in %[2]s; do
	echo "file $f $(cat "$d/$f" 2>/dev/null || echo -)"
	echo "pod $f $(cat "$d/../$f" 2>/dev/null || echo -)"
done
systemctl show -p AllowedCPUs -p AllowedMemoryNodes -p MemoryMin -p MemoryHigh %[1]s | sed 's/^/systemd /; s/=/ /'
for p in $(cat "$d/cgroup.procs"); do
	s=$(cat /proc/$p/status 2>/dev/null) || continue
	echo "proc $p $(echo "$s" | sed -n 's/^Cpus_allowed_list:[[:space:]]*//p') $(echo "$s" | sed -n 's/^Mems_allowed_list:[[:space:]]*//p')"
done
`, shellQuote(name), strings.Join(guestCgroupFiles, " "))
	out, err := n.vm.Run(script)
	if err != nil {
		return GuestCgroup{}, err
	}
	g := GuestCgroup{Unit: name, Files: map[string]string{}, Pod: map[string]string{}, Systemd: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		value := func(i int) string {
			if len(f) > i {
				return strings.Join(f[i:], " ")
			}
			return ""
		}
		switch f[0] {
		case "path":
			g.Path = f[1]
		case "file":
			g.Files[f[1]] = value(2)
		case "pod":
			g.Pod[f[1]] = value(2)
		case "systemd":
			g.Systemd[f[1]] = value(2)
		case "proc":
			var p Process
			if _, err := fmt.Sscan(f[1], &p.PID); err != nil {
				return g, fmt.Errorf("in the VM: a process line %q: %w", line, err)
			}
			if len(f) > 2 {
				p.CPUsAllowed = f[2]
			}
			if len(f) > 3 {
				p.MemsAllowed = f[3]
			}
			g.Processes = append(g.Processes, p)
		}
	}
	if len(g.Processes) == 0 {
		return g, fmt.Errorf("container %s has no process in %s", containerID, g.Path)
	}
	return g, nil
}
