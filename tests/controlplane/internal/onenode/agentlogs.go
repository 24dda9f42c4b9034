package onenode

// The agent's container logs, kept for the run: the kubelet removes a pod's logs with the pod,
// and the scenarios delete, roll and upgrade the agent's pods, so a failure after a rollout
// would otherwise have lost the log of the agent that caused it. A hard link made while the
// log exists keeps its file (and what the runtime goes on writing to it) after the kubelet
// removes the name; a log the kubelet rotates is a new file, linked again.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// agentLogsPoll is how often the pods' log directory is looked at: an agent's container lives
// for seconds at least, and its pod's logs outlive a crashed container until the pod goes.
const agentLogsPoll = 250 * time.Millisecond

// AgentLogsDir is where the agent's container logs are kept, under the run directory.
func (n *Node) AgentLogsDir() string { return n.l.at("logs/agents") }

// keepAgentLogs links every log file of the agent's pods into AgentLogsDir until stop closes.
func (n *Node) keepAgentLogs(stop <-chan struct{}) {
	kept := map[[2]uint64]bool{}
	tick := time.NewTicker(agentLogsPoll)
	defer tick.Stop()
	for {
		linkAgentLogs(n.l.at("pod-logs"), n.AgentLogsDir(), kept)
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// linkAgentLogs links each file under podLogs/<Namespace>_<pod>_<uid>/<container>/ not linked
// yet (by device and inode, in kept) into dir as <pod>_<container>_<file>, with a suffix when
// the name is taken by an earlier file (a rotated log). Errors are left for the next look: the
// kubelet may remove a pod's directory at any moment.
func linkAgentLogs(podLogs, dir string, kept map[[2]uint64]bool) {
	files, _ := filepath.Glob(filepath.Join(podLogs, Namespace+"_*", "*", "*.log*"))
	for _, f := range files {
		var st syscall.Stat_t
		if syscall.Stat(f, &st) != nil {
			continue
		}
		id := [2]uint64{uint64(st.Dev), st.Ino}
		if kept[id] {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return
		}
		rel, _ := filepath.Rel(podLogs, f)
		parts := strings.Split(rel, string(filepath.Separator))
		pod := strings.TrimPrefix(parts[0], Namespace+"_")
		// <pod>_<uid>: the UID's first group is enough to tell two pods of one name apart.
		if i := strings.LastIndex(pod, "_"); i > 0 && len(pod) > i+9 {
			pod = pod[:i+9]
		}
		name := strings.Join([]string{pod, parts[1], parts[2]}, "_")
		for i := 1; ; i++ {
			err := os.Link(f, filepath.Join(dir, name))
			if err == nil {
				kept[id] = true
				break
			}
			if !os.IsExist(err) {
				break
			}
			name = fmt.Sprintf("%s_%s_%s.%d", pod, parts[1], parts[2], i)
		}
	}
}

// agentLogTails is the end of each kept agent log, the newest last, at most the newest count.
func agentLogTails(dir string, count, lines int) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("(no agent logs kept: %v)\n", err)
	}
	type log struct {
		path string
		mod  time.Time
	}
	var logs []log
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			logs = append(logs, log{filepath.Join(dir, e.Name()), info.ModTime()})
		}
	}
	// ReadDir sorts by name: of two written in one tick of the clock, a rotated one (".1") is the later.
	sort.SliceStable(logs, func(i, j int) bool { return logs[i].mod.Before(logs[j].mod) })
	if len(logs) > count {
		logs = logs[len(logs)-count:]
	}
	var b strings.Builder
	for _, l := range logs {
		text, err := readFile(l.path)
		if err != nil {
			text = err.Error()
		}
		all := strings.Split(strings.TrimRight(text, "\n"), "\n")
		if len(all) > lines {
			all = all[len(all)-lines:]
		}
		fmt.Fprintf(&b, "--- %s (its end):\n%s\n", l.path, strings.Join(all, "\n"))
	}
	return b.String()
}
