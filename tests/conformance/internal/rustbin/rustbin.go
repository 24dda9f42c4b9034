// Package rustbin locates the Rust binaries and examples the conformance tests drive.
//
// `cargo xtask test` builds them and passes their directory in RESMGR_BIN_DIR. When the variable
// is unset (a developer running `go test` by hand), the first lookup builds the workspace's
// binaries and examples with cargo and uses cargo's debug output directory.
package rustbin

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

var (
	once   sync.Once
	binDir string
	errDir error
)

// Path returns the absolute path of a binary (or example) built from the workspace, building the
// workspace first if RESMGR_BIN_DIR is not set. An example lives in the "examples" subdirectory:
// ask for "examples/<name>".
func Path(name string) (string, error) {
	once.Do(func() { binDir, errDir = locate() })
	if errDir != nil {
		return "", errDir
	}
	p := filepath.Join(binDir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("rust binary %q not found in %s (RESMGR_BIN_DIR): %w", name, binDir, err)
	}
	return p, nil
}

func locate() (string, error) {
	if dir := os.Getenv("RESMGR_BIN_DIR"); dir != "" {
		return dir, nil
	}
	// As `cargo xtask test` builds them (xtask/src/workspace.rs): the agent on its own, as the
	// release builds it, so that no feature a test package turns on reaches it.
	for _, args := range [][]string{
		{"build", "--workspace", "--exclude", "plugin-bin", "--bins", "--examples"},
		{"build", "-p", "plugin-bin", "--bin", "resmgr"},
	} {
		build := exec.Command("cargo", args...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return "", fmt.Errorf("building the Rust workspace: %w", err)
		}
	}
	out, err := exec.Command("cargo", "metadata", "--format-version", "1", "--no-deps").Output()
	if err != nil {
		return "", fmt.Errorf("cargo metadata: %w", err)
	}
	var meta struct {
		TargetDirectory string `json:"target_directory"`
	}
	if err := json.Unmarshal(out, &meta); err != nil {
		return "", fmt.Errorf("parsing cargo metadata: %w", err)
	}
	return filepath.Join(meta.TargetDirectory, "debug"), nil
}
