package onenode

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hierarchy is one mounted cgroup hierarchy: its mount point and whether it is cgroup v2.
type hierarchy struct {
	Mount string `json:"mount"`
	V2    bool   `json:"v2"`
	// Controllers of a v1 hierarchy, from its mount options (cpuset, pids, name=systemd...).
	Controllers []string `json:"controllers"`
}

func (h hierarchy) has(controller string) bool {
	for _, c := range h.Controllers {
		if c == controller {
			return true
		}
	}
	return false
}

// hierarchies reads the cgroup mounts of this mount namespace.
func hierarchies() ([]hierarchy, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []hierarchy
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 4 {
			continue
		}
		switch fields[2] {
		case "cgroup2":
			out = append(out, hierarchy{Mount: fields[1], V2: true})
		case "cgroup":
			var controllers []string
			for _, o := range strings.Split(fields[3], ",") {
				switch o {
				case "rw", "ro", "nosuid", "nodev", "noexec", "relatime", "noatime", "nsdelegate", "clone_children":
				default:
					controllers = append(controllers, o)
				}
			}
			out = append(out, hierarchy{Mount: fields[1], Controllers: controllers})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted (/proc/self/mounts)")
	}
	return out, s.Err()
}

// makeCgroups creates the run's cgroup root in every hierarchy (the kubelet's cgroupRoot must
// exist in each), with the cpuset controller's cpus and mems copied from the hierarchy's root so
// that pods may use every CPU, and the cgroup the daemons run in, where processes are counted
// (pids, or the v2 tree). It returns that cgroup's cgroup.procs.
func makeCgroups(hs []hierarchy, root string) (string, error) {
	var daemons string
	for _, h := range hs {
		dir := filepath.Join(h.Mount, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return "", err
		}
		switch {
		case h.V2:
			// Controllers are delegated from the top; a v2 cgroup with children holds no processes.
			for _, d := range []string{h.Mount, dir} {
				_ = os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpuset +cpu +memory +pids"), 0)
			}
		case h.has("cpuset"):
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				value, err := os.ReadFile(filepath.Join(h.Mount, f))
				if err != nil {
					return "", err
				}
				if err := os.WriteFile(filepath.Join(dir, f), value, 0); err != nil {
					return "", fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
				}
			}
		}
		if h.V2 && !onlyUnified(hs) {
			continue
		}
		if h.V2 || h.has("pids") {
			d := filepath.Join(dir, "daemons")
			if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
				return "", err
			}
			daemons = filepath.Join(d, "cgroup.procs")
		}
	}
	if daemons == "" {
		return "", errors.New("no pids cgroup controller and no cgroup v2: the run could not count its processes")
	}
	return daemons, nil
}

// onlyUnified says whether the machine has cgroup v2 alone (no v1 hierarchy).
func onlyUnified(hs []hierarchy) bool {
	for _, h := range hs {
		if !h.V2 {
			return false
		}
	}
	return true
}

// countingHierarchy is where every process of the run is found: the v1 pids hierarchy, or the
// v2 tree.
func countingHierarchy(hs []hierarchy) (hierarchy, bool) {
	for _, h := range hs {
		if !h.V2 && h.has("pids") {
			return h, true
		}
	}
	for _, h := range hs {
		if h.V2 {
			return h, true
		}
	}
	return hierarchy{}, false
}

// pidsUnder lists every process in dir and the cgroups below it.
func pidsUnder(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, line := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(line); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// killCgroup SIGKILLs every process under the run's cgroup until none is left (containers,
// shims, the daemons and the namespace holder), then removes the run's cgroups in every
// hierarchy, deepest first.
func killCgroup(hs []hierarchy, root string) error {
	var errs []error
	if h, ok := countingHierarchy(hs); ok {
		dir := filepath.Join(h.Mount, root)
		deadline := time.Now().Add(30 * time.Second)
		for {
			pids := pidsUnder(dir)
			if len(pids) == 0 {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("processes %v in %s outlived SIGKILL for 30 s", pids, dir))
				break
			}
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, h := range hs {
		if err := removeCgroupTree(filepath.Join(h.Mount, root)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroupTree removes a cgroup and those below it, deepest first; a cgroup whose last
// process is still exiting is retried for a few seconds.
func removeCgroupTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := len(dirs) - 1; i >= 0; i-- {
		for {
			err := syscall.Rmdir(dirs[i])
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("removing cgroup %s: %w", dirs[i], err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// network is the run's link between the host and its network namespace: a veth pair, the host
// end addressed hostIP and the namespace's end nodeIP, in a /30 of 10.253.0.0/16 that no route
// of the host uses.
type network struct {
	HostLink string `json:"hostLink"`
	HostIP   string `json:"hostIP"`
	NodeIP   string `json:"nodeIP"`
}

// pickNetwork chooses a free /30 and a link name from the run's ID.
func pickNetwork(id string) (network, error) {
	routes, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return network{}, fmt.Errorf("ip route: %w", err)
	}
	addrs, err := exec.Command("ip", "-4", "-o", "addr").Output()
	if err != nil {
		return network{}, fmt.Errorf("ip addr: %w", err)
	}
	used := string(routes) + string(addrs)
	for range 100 {
		third, fourth := rand.IntN(256), 4*rand.IntN(64)
		base := fmt.Sprintf("10.253.%d.", third)
		if strings.Contains(used, fmt.Sprintf("%s%d/30", base, fourth)) ||
			strings.Contains(used, fmt.Sprintf("%s%d ", base, fourth+1)) ||
			strings.Contains(used, fmt.Sprintf("%s%d/", base, fourth+2)) {
			continue
		}
		return network{
			HostLink: "rmc" + id[:8],
			HostIP:   fmt.Sprintf("%s%d", base, fourth+1),
			NodeIP:   fmt.Sprintf("%s%d", base, fourth+2),
		}, nil
	}
	return network{}, errors.New("no free /30 in 10.253.0.0/16")
}

// run runs a command and returns an error with its output when it fails.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// inNamespaces runs a command in the holder's namespaces (mount and network).
func inNamespaces(holder int, args ...string) error {
	return run("nsenter", append([]string{"--target", strconv.Itoa(holder), "--mount", "--net", "--"}, args...)...)
}

// alive says whether pid is a running process (not a zombie).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name's closing parenthesis.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
