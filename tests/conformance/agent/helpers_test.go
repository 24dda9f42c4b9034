// Small helpers of the agent test: cpuset overlap, the fake API server's URL, exit errors.
package agent

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/resmgr/resmgr/tests/gokit/cpulist"
)

// cpus expands a kernel cpu list ("0-3,8"); a malformed one panics, failing the test.
func cpus(list string) cpulist.Set { return cpulist.MustParse(list) }

func overlaps(a, b string) bool { return cpus(a).Overlaps(cpus(b)) }

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
