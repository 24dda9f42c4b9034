// A panic stops the agent: a bug in the middle of a claim's change (here a panic at the crash
// point prepare.allocated, where the policy has allocated the claim in memory and nothing of it
// is recorded, saved or delivered yet) ends the process at once, non-zero, instead of answering
// the kubelet from a half-changed manager. The kubelet's call gets Unavailable, never OK; nothing
// of the change reaches the disk or the runtime; the restarted agent finds the state and the
// specs consistent and grants the claim.
package agent

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

func TestAPanicStopsTheAgent(t *testing.T) {
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", crashAt: "prepare.allocated:panic"})
	endpoint := c.ready()

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	claim := &drav1.Claim{Namespace: "default", Name: "db-cpus", Uid: claimUID}
	resp, err := draClient(t, endpoint).NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{claim}})
	if code := grpcstatus.Code(err); code != codes.Unavailable {
		t.Fatalf("the agent panicked in the middle of the claim's change and the kubelet got %v (%v, %+v), want Unavailable", code, err, resp)
	}

	// The process stopped at once: aborted by the panic, not drained.
	select {
	case err := <-c.exited:
		var exit *exec.ExitError
		if err == nil || !asExitError(err, &exit) {
			t.Fatalf("the agent ended with %v after the panic, want it aborted", err)
		}
		if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
			t.Fatalf("the agent ended with %v after the panic, want SIGABRT", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the agent serves on after a panic in the middle of a claim's change")
	}
	logs := c.logs.String()
	for _, want := range []string{"crash point prepare.allocated: panicking", "a panic stops the agent at once"} {
		if !strings.Contains(logs, want) {
			t.Fatalf("the agent's logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "state saved") {
		t.Fatalf("the agent saved its state after the panic:\n%s", logs)
	}

	// Nothing of the half-done change reached the disk or the runtime.
	c.specsAccounted("after the panic")
	if held := c.savedClaims(); len(held) != 0 {
		t.Fatalf("the state holds %v after a panic before the claim's commit", held)
	}
	if cpus := c.appliedCPUs("web-app"); cpus != "" {
		t.Fatalf("the runtime moved web-app to %q for a claim the agent never committed", cpus)
	}

	// Restarted (the DaemonSet's restart), the agent starts from the disk and grants the claim.
	c.crashAt = ""
	for drained := false; !drained; {
		select {
		case <-c.active:
		default:
			drained = true
		}
	}
	c.launch()
	endpoint = c.ready()
	if got := c.prepare(t, draClient(t, endpoint), "db-cpus", claimUID); got.GetError() != "" || len(got.GetDevices()) != 1 {
		t.Fatalf("the restarted agent answered the kubelet's retry with %+v", got)
	}
	claimed := c.claimedCPUs(claimUID)
	if web := c.appliedCPUs("web-app"); web == "" || overlaps(web, claimed) {
		t.Fatalf("web-app runs on %q; the claim holds %q", web, claimed)
	}
	c.specsAccounted("after the restart")
	if held := c.savedClaims(); len(held) != 1 || held[0] != claimUID {
		t.Fatalf("the state holds %v after the restarted agent prepared %s", held, claimUID)
	}
}

// savedClaims are the claims the state on disk holds, sorted (none without a state file).
func (c *cluster) savedClaims() []string {
	c.t.Helper()
	data, err := os.ReadFile(c.path("state", "state.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	var state struct {
		Claims map[string]json.RawMessage `json:"claims"`
	}
	if err := json.Unmarshal(data, &state); err != nil {
		c.t.Fatalf("the state file: %v", err)
	}
	var uids []string
	for uid := range state.Claims {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	return uids
}

// specsAccounted checks the crash invariant on disk: every CDI spec of ours belongs to a claim
// the saved state holds.
func (c *cluster) specsAccounted(when string) {
	c.t.Helper()
	specs, err := filepath.Glob(c.path("cdi", driver+"-device_*.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	held := map[string]bool{}
	for _, uid := range c.savedClaims() {
		held[uid] = true
	}
	for _, spec := range specs {
		uid := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(spec), driver+"-device_"), ".json")
		if !held[uid] {
			c.t.Fatalf("%s: the spec of claim %s is on disk; the state holds %v", when, uid, c.savedClaims())
		}
	}
}
