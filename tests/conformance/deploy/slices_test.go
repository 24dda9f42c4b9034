package deploy

import (
	"os/exec"
	"strings"
	"testing"
)

// What `resmgr slices` prints, the objects the agent's publisher creates, is valid against the
// Kubernetes 1.34 schemas in every device model and in each API version the agent speaks, so an
// operator can `kubectl create -f` it and the benchmark loads it as it is.
func TestPrintedResourceSlicesMatchTheKubernetes134Schemas(t *testing.T) {
	common := []string{"slices", "--node-name", "worker-1", "--node-uid", "3f1c2b9e-0000-4000-8000-000000000001",
		"--topology", "synthetic:pack:2 numa:2 core:32 pu:2", "--reserved-cpu-count", "2"}
	cases := map[string]struct {
		flags  []string
		slices int
	}{
		"grouped":               {nil, 1},
		"grouped by socket":     {[]string{"--group-by", "socket", "--claim-granularity", "core"}, 1},
		"individual":            {[]string{"--device-mode", "individual"}, 2},
		"individual cores":      {[]string{"--device-mode", "individual", "--claim-granularity", "core"}, 1},
		"individual on v1beta2": {[]string{"--device-mode", "individual", "--api-version", "v1beta2"}, 2},
		"individual on v1beta1": {[]string{"--device-mode", "individual", "--api-version", "v1beta1"}, 2},
		"grouped on v1beta1":    {[]string{"--api-version", "v1beta1"}, 1},
		"partition":             {[]string{"--cpu-exclusivity", "partition", "--claim-cpus", "16"}, 1},
		"pods: one empty slice": {[]string{"--cpu-exclusivity", "pods"}, 1},
		"json list":             {[]string{"--output", "json"}, 1},
		"individual as json":    {[]string{"--device-mode", "individual", "--output", "json"}, 2},
	}
	// The check is live on this output: the node-allocatable mapping is a Kubernetes 1.36 field,
	// which the 1.34 schemas refuse.
	t.Run("node-allocatable-cpu is refused by 1.34", func(t *testing.T) {
		flags := append(append([]string{}, common...), "--node-allocatable-cpu", "true")
		out, err := exec.Command(resmgrBinary(t), flags...).Output()
		if err != nil {
			t.Fatalf("resmgr slices --node-allocatable-cpu true: %v", err)
		}
		if !strings.Contains(string(out), "nodeAllocatableResourceMappings") {
			t.Fatalf("no mapping printed:\n%s", out)
		}
		if _, failures := validate(t, "node-allocatable", out); len(failures) == 0 {
			t.Fatal("kubeconform accepted a field Kubernetes 1.34 does not know")
		}
	})
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(resmgrBinary(t), append(append([]string{}, common...), c.flags...)...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("resmgr slices %v: %v\n%s", c.flags, err, stderr.String())
			}
			valid, failures := validate(t, name, out)
			for _, f := range failures {
				t.Error(f)
			}
			if len(valid) != c.slices {
				t.Errorf("%d valid objects %v, want %d ResourceSlices", len(valid), valid, c.slices)
			}
			for _, v := range valid {
				if !strings.HasPrefix(v, "ResourceSlice") {
					t.Errorf("printed a %s", v)
				}
			}
		})
	}
}
