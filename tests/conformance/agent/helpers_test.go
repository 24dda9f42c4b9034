// Small helpers of the agent test: cpuset overlap, the fake API server's URL, exit errors.
package agent

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// cpus expands a kernel cpu list ("0-3,8").
func cpus(list string) map[int]bool {
	out := map[int]bool{}
	for _, part := range strings.Split(list, ",") {
		if part == "" {
			continue
		}
		lo, hi, found := strings.Cut(part, "-")
		a, _ := strconv.Atoi(lo)
		b := a
		if found {
			b, _ = strconv.Atoi(hi)
		}
		for i := a; i <= b; i++ {
			out[i] = true
		}
	}
	return out
}

func overlaps(a, b string) bool {
	bs := cpus(b)
	for c := range cpus(a) {
		if bs[c] {
			return true
		}
	}
	return false
}

// kubeURL reads the server URL back from the kubeconfig the fake API server wrote.
func kubeURL(t *testing.T, kubeconfig string) string {
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if _, rest, ok := strings.Cut(line, `server: "`); ok {
			return strings.TrimSuffix(strings.TrimSuffix(rest, "}"), `"`)
		}
	}
	t.Fatalf("no server in %s", data)
	return ""
}

func asExitError(err error, target **exec.ExitError) bool { return errors.As(err, target) }
