package onenode

// Hugepages for one cluster: the hugetlb v1 controller mounted inside the run's mount
// namespace where the machine's v1 hierarchies lack it, and a few 2 MiB pages reserved in the
// kernel before the kubelet starts, both given back by Down.
//
// On a hybrid cgroup v1 machine (v1 controllers, cgroup2 at /sys/fs/cgroup/unified) every
// controller no v1 hierarchy has stays on cgroup2, where neither the kubelet nor runc set it.
// Mounting hugetlb as v1 moves it there while the mount or its cgroups exist. The kubelet and
// runc look for a v1 controller in a directory named after it in the cgroup root
// (/sys/fs/cgroup, a tmpfs the host shares), so the namespace gets a tmpfs of its own there
// holding the host's hierarchies (bound) and hugetlb: the host's directory is never written.
// The kernel keeps a v1 hierarchy while it has cgroups, also unmounted, so Down removes the
// run's hugetlb cgroups after the namespace is gone by mounting the hierarchy again in a
// throwaway namespace (the same superblock: the same cgroups).
//
// The pages are the machine's (nr_hugepages is not namespaced) and other runs, the Rust e2e
// runner's included (tests/src/bin/e2e/hugetlb.rs), reserve theirs at the same time: a run adds
// its pages under an exclusive flock of the nr_hugepages file, records what the kernel gave in
// its run directory before anything else can fail, and Down takes back only that.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

const (
	// NRHugepages2M is the count of 2 MiB pages in sysfs.
	NRHugepages2M = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
	// hugepageRecord is the file of a run directory recording the pages it reserved (the Rust
	// runner's name).
	hugepageRecord = "hugepages-2048kB.reserved"
	// ReservedHugepages is how many 2 MiB pages a run reserves: room for a 4Mi claim whose
	// hugepages are also listed in the pod's resources, both charged against the node.
	ReservedHugepages = 4
)

// hugetlbNeeded says whether the run must mount hugetlb itself: a v1 machine whose v1
// hierarchies lack it, with a kernel that has it.
func hugetlbNeeded(hs []hierarchy) bool {
	if onlyUnified(hs) {
		return false
	}
	for _, h := range hs {
		if !h.V2 && h.has("hugetlb") {
			return false
		}
	}
	data, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "hugetlb" && f[3] == "1" {
			return true
		}
	}
	return false
}

// cgroupMountRoot is the directory holding the v1 hierarchies (/sys/fs/cgroup).
func cgroupMountRoot(hs []hierarchy) (string, error) {
	for _, h := range hs {
		if !h.V2 && h.has("cpuset") {
			return filepath.Dir(h.Mount), nil
		}
	}
	return "", errors.New("no cpuset v1 hierarchy: no cgroup root to add hugetlb to")
}

// mountHugetlbScript runs in the holder's namespaces, before / is made shared (a mount cannot
// be moved from under a shared parent): $1 the tmpfs's mount point in the run directory, $2
// the cgroup root, $3 the run's cgroup root. It makes the run's cgroup root in hugetlb, which
// the kubelet requires in every hierarchy.
const mountHugetlbScript = `set -e
ours=$1 root=$2
mkdir -p "$ours"
mount -t tmpfs -o mode=755 cgroup-root "$ours"
for e in "$root"/*; do
  name=${e##*/}
  if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$ours/$name"
  elif [ -d "$e" ]; then mkdir "$ours/$name" && mount --rbind "$e" "$ours/$name"
  fi
done
mkdir "$ours/hugetlb"
mount -t cgroup -o hugetlb hugetlb "$ours/hugetlb"
mount --move "$ours" "$root"
mkdir "$root/hugetlb/$3"
`

// mountHugetlb mounts hugetlb in the holder's namespace and records where (inside it).
func (n *Node) mountHugetlb(hs []hierarchy) error {
	root, err := cgroupMountRoot(hs)
	if err != nil {
		return err
	}
	if err := inNamespaces(n.st.Holder, "sh", "-c", mountHugetlbScript, "sh", n.l.at("cgroup-root"), root, n.st.CgroupRoot); err != nil {
		return fmt.Errorf("mounting the hugetlb controller in the run's namespace: %w", err)
	}
	n.st.Hugetlb = filepath.Join(root, "hugetlb")
	return n.save()
}

// hugetlbMount is where this process sees the run's hugetlb hierarchy: through the holder's
// root while it lives, or a v1 hierarchy of the machine's.
func (n *Node) hugetlbMount() (string, error) {
	if n.st.Hugetlb != "" {
		return filepath.Join("/proc", strconv.Itoa(n.st.Holder), "root", n.st.Hugetlb), nil
	}
	for _, h := range n.st.Hierarchies {
		if (!h.V2 && h.has("hugetlb")) || (h.V2 && onlyUnified(n.st.Hierarchies)) {
			return h.Mount, nil
		}
	}
	return "", errors.New("no hugetlb hierarchy: the machine's kernel lacks the controller")
}

// hugetlbCgroupsScript mounts the hugetlb hierarchy in the private mount namespace unshare(1)
// made ($1 the run's cgroup root, $2 remove or check) and removes the run's cgroups there,
// deepest first, or says whether any is left.
const hugetlbCgroupsScript = `set -e
d=$(mktemp -d)
trap 'umount "$d" 2>/dev/null; rmdir "$d"' EXIT
mount -t cgroup -o hugetlb hugetlb "$d"
[ -d "$d/$1" ] || exit 0
if [ "$2" = check ]; then echo "hugetlb cgroup /$1 is left"; exit 0; fi
i=0
until find "$d/$1" -depth -type d -exec rmdir {} + 2>/dev/null; do
  i=$((i+1))
  if [ $i -ge 100 ]; then echo "hugetlb cgroups left: $(find "$d/$1" -type d)" >&2; exit 1; fi
  sleep 0.1
done
`

// hugetlbCgroups removes the run's hugetlb cgroups (check: only reports them) once its
// namespace is gone, in a throwaway mount namespace; what is left.
func hugetlbCgroups(cgroupRoot string, check bool) (string, error) {
	mode := "remove"
	if check {
		mode = "check"
	}
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", hugetlbCgroupsScript, "sh", cgroupRoot, mode).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("removing the run's hugetlb cgroups (/%s): %w\n%s", cgroupRoot, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// lockedCount runs f on the page count in file under an exclusive flock of it.
func lockedCount(file string, f func(now int) error) error {
	h, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := syscall.Flock(int(h.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", file, err)
	}
	now, err := pageCount(file)
	if err != nil {
		return err
	}
	return f(now)
}

func pageCount(file string) (int, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a page count", file, strings.TrimSpace(string(data)))
	}
	return n, nil
}

func writeCount(file string, n int) error {
	if err := os.WriteFile(file, []byte(strconv.Itoa(n)+"\n"), 0); err != nil {
		return fmt.Errorf("writing %d to %s: %w", n, file, err)
	}
	return nil
}

// reserveHugepages adds pages to the count in file for the run in dir; how many the kernel
// gave (fewer, down to none, when memory is fragmented), recorded in dir.
func reserveHugepages(file, dir string, pages int) (int, error) {
	got := 0
	err := lockedCount(file, func(before int) error {
		if err := writeCount(file, before+pages); err != nil {
			return err
		}
		after, err := pageCount(file)
		if err != nil {
			return err
		}
		if got = max(after-before, 0); got > 0 {
			if err := os.WriteFile(filepath.Join(dir, hugepageRecord), []byte(strconv.Itoa(got)), 0o600); err != nil {
				return fmt.Errorf("recording the reserved hugepages in %s: %w", dir, err)
			}
		}
		return nil
	})
	return got, err
}

// releaseHugepages gives back the pages the run in dir reserved, if it did; other runs' stay.
func releaseHugepages(file, dir string) error {
	record := filepath.Join(dir, hugepageRecord)
	data, err := os.ReadFile(record)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	ours, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("%s: %q is not a page count", record, data)
	}
	if err := lockedCount(file, func(now int) error { return writeCount(file, max(now-ours, 0)) }); err != nil {
		return fmt.Errorf("giving back the run's %d hugepages: %w", ours, err)
	}
	return os.Remove(record)
}

// Hugepages2M is how many 2 MiB pages the run reserved for its node.
func (n *Node) Hugepages2M() int { return n.st.Hugepages2M }
