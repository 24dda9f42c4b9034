// Smoke test: the CDI cache containerd and CRI-O use builds and runs here: it loads a spec
// directory, resolves a qualified device name and injects its edits into an OCI spec.
package cdi

import (
	"os"
	"path/filepath"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestCacheResolvesAndInjects(t *testing.T) {
	dir := t.TempDir()
	spec := `{"cdiVersion":"0.3.0","kind":"smoke.example.com/device","devices":[` +
		`{"name":"dev0","containerEdits":{"env":["SMOKE=1"]}}]}`
	if err := os.WriteFile(filepath.Join(dir, "smoke.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("NewCache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("cache errors: %v", errs)
	}
	oci := &oci.Spec{Process: &oci.Process{}}
	if unresolved, err := cache.InjectDevices(oci, "smoke.example.com/device=dev0"); err != nil {
		t.Fatalf("InjectDevices: %v (unresolved %v)", err, unresolved)
	}
	if len(oci.Process.Env) != 1 || oci.Process.Env[0] != "SMOKE=1" {
		t.Fatalf("injected env %v, want [SMOKE=1]", oci.Process.Env)
	}
}
