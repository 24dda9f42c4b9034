package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"
)

// The release name and namespace the plain manifests are rendered as (tools/helm-chart/src/lib.rs).
const (
	plainReleaseName = "resmgr"
	plainNamespace   = "resmgr-system"
)

// TestMain removes the generated schemas after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if schemasDir != "" {
		os.RemoveAll(schemasDir)
	}
	os.Exit(code)
}

// repoRoot is the repository root: this package lives in tests/conformance/deploy.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "deploy", "helm", "resmgr", "Chart.yaml")); err != nil {
		t.Fatalf("repository root %s has no chart: %v", root, err)
	}
	return root
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// documents splits a multi-document YAML text into JSON objects, skipping empty documents.
func documents(t *testing.T, text string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, doc := range strings.Split("\n"+text, "\n---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("parsing %q: %v", doc, err)
		}
		if len(obj) > 0 {
			out = append(out, obj)
		}
	}
	return out
}

// toJSON converts a YAML text to JSON bytes.
func toJSON(t *testing.T, doc []byte) []byte {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

var (
	xtaskOnce sync.Once
	xtaskPath string
	xtaskErr  error
)

// xtask returns the xtask binary: from RESMGR_BIN_DIR when `cargo xtask test` set it, else
// built with cargo.
func xtask(t *testing.T) string {
	t.Helper()
	xtaskOnce.Do(func() {
		if dir := os.Getenv("RESMGR_BIN_DIR"); dir != "" {
			xtaskPath = filepath.Join(dir, "xtask")
			_, xtaskErr = os.Stat(xtaskPath)
			return
		}
		root, err := filepath.Abs(filepath.Join("..", "..", ".."))
		if err != nil {
			xtaskErr = err
			return
		}
		build := exec.Command("cargo", "build", "-p", "xtask")
		build.Dir = root
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			xtaskErr = fmt.Errorf("building xtask: %w", err)
			return
		}
		meta := exec.Command("cargo", "metadata", "--format-version", "1", "--no-deps")
		meta.Dir = root
		out, err := meta.Output()
		if err != nil {
			xtaskErr = fmt.Errorf("cargo metadata: %w", err)
			return
		}
		var m struct {
			TargetDirectory string `json:"target_directory"`
		}
		if err := json.Unmarshal(out, &m); err != nil {
			xtaskErr = err
			return
		}
		xtaskPath = filepath.Join(m.TargetDirectory, "debug", "xtask")
	})
	if xtaskErr != nil {
		t.Fatalf("the xtask binary is needed: %v", xtaskErr)
	}
	return xtaskPath
}

// runXtask runs the xtask binary with args in the repository, failing the test on error.
func runXtask(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(xtask(t), args...)
	cmd.Dir = repoRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("xtask %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
}
