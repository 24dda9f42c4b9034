package onenode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A kept log outlives its pod's directory and keeps what was written to it after it was kept;
// a rotated log is kept beside the first under a new name; another namespace's logs are not.
func TestAnAgentsLogOutlivesItsPodAndARotatedOneIsKeptBeside(t *testing.T) {
	podLogs, dir := t.TempDir(), t.TempDir()
	pod := filepath.Join(podLogs, Namespace+"_resmgr-x7k2p_0a1b2c3d-1111-2222-3333-444455556666", "resmgr")
	other := filepath.Join(podLogs, "default_app_0a1b2c3d-1111-2222-3333-444455556666", "app")
	for _, d := range []string{pod, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, text string) {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(text); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(pod, "0.log")
	write(log, "started\n")
	write(filepath.Join(other, "0.log"), "not the agent\n")
	kept := map[[2]uint64]bool{}
	linkAgentLogs(podLogs, dir, kept)
	write(log, "handed over\n")
	// The kubelet rotates: the old file gets a new name, the runtime a new 0.log.
	if err := os.Rename(log, log+".20261207-120000"); err != nil {
		t.Fatal(err)
	}
	write(log, "after the rotation\n")
	linkAgentLogs(podLogs, dir, kept)
	linkAgentLogs(podLogs, dir, kept)
	if err := os.RemoveAll(filepath.Dir(filepath.Dir(pod))); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got[e.Name()] = string(data)
	}
	want := map[string]string{
		"resmgr-x7k2p_0a1b2c3d_resmgr_0.log":   "started\nhanded over\n",
		"resmgr-x7k2p_0a1b2c3d_resmgr_0.log.1": "after the rotation\n",
	}
	if len(got) != len(want) {
		t.Fatalf("kept %v, want %v", got, want)
	}
	for name, text := range want {
		if got[name] != text {
			t.Errorf("%s holds %q, want %q (kept: %v)", name, got[name], text, got)
		}
	}
	if tails := agentLogTails(dir, 1, 1); !strings.Contains(tails, "after the rotation") || strings.Contains(tails, "started") {
		t.Errorf("the newest log's last line: %q", tails)
	}
}
