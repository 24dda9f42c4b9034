package deploy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/resmgr/resmgr/tools/helm-chart/go/chart"
)

// `cargo xtask release` (with the debug binary, to spare a release build) writes the binary,
// the manifests with the version as image tag, a chart package that Helm loads and renders into
// exactly those manifests, the agent's image named as those manifests name it, and checksums
// that match every file.
func TestReleaseWritesLoadableChartManifestsAndMatchingChecksums(t *testing.T) {
	root := repoRoot(t)
	work := t.TempDir()
	binary := resmgrBinary(t)
	out := filepath.Join(work, "dist")
	runXtask(t, "release", "--out", out, "--binary", binary)

	meta, err := chart.Load(filepath.Join(root, "deploy", "helm", "resmgr"))
	if err != nil {
		t.Fatal(err)
	}
	version := meta.Metadata.Version
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[runtime.GOARCH]
	binName := "resmgr-" + version + "-" + arch + "-linux"
	chartName := "resmgr-" + version + ".tgz"
	manifestsName := "resmgr-" + version + ".yaml"
	dashboardName := "resmgr-" + version + "-grafana-dashboard.json"
	alertsName := "resmgr-" + version + "-prometheus-alerts.yaml"
	imageName := "resmgr-" + version + "-image-" + runtime.GOARCH + ".tar"
	want := []string{"SHA256SUMS", binName, chartName, manifestsName, dashboardName, alertsName, imageName}
	slices.Sort(want)
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("dist holds %v, want %v", got, want)
	}

	// Every file but SHA256SUMS is listed once, with its SHA-256, in `sha256sum -c` format.
	sums, err := os.Open(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer sums.Close()
	var listed []string
	scanner := bufio.NewScanner(sums)
	for scanner.Scan() {
		digest, name, ok := strings.Cut(scanner.Text(), "  ")
		if !ok {
			t.Fatalf("malformed SHA256SUMS line %q", scanner.Text())
		}
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatalf("SHA256SUMS lists %s: %v", name, err)
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != digest {
			t.Errorf("%s: checksum %s does not match its content", name, digest)
		}
		listed = append(listed, name)
	}
	slices.Sort(listed)
	if !slices.Equal(listed, want[1:]) {
		t.Errorf("SHA256SUMS lists %v, want %v", listed, want[1:])
	}

	bin, err := os.ReadFile(filepath.Join(out, binName))
	given, _ := os.ReadFile(binary)
	if err != nil || !bytes.Equal(bin, given) {
		t.Errorf("the shipped binary is not the one given (%s): %v", binary, err)
	}

	// The image, named as the manifests name it, holds what it must to run that binary.
	checkImage(t, filepath.Join(out, imageName), binary, version)

	// Helm loads the package, and renders it with the plain values and the release's image tag
	// into exactly the release's manifests.
	packaged, err := chart.Load(filepath.Join(out, chartName))
	if err != nil {
		t.Fatalf("helm cannot load the packaged chart: %v", err)
	}
	if packaged.Metadata.Version != version || packaged.Metadata.AppVersion != version {
		t.Errorf("packaged chart has version %s, appVersion %s, want %s", packaged.Metadata.Version, packaged.Metadata.AppVersion, version)
	}
	tag := valuesFile(t, "tag", "image: {tag: \""+version+"\"}\n")
	helm := helmRender(t, packaged, filepath.Join(root, "deploy", "manifests.values.yaml"), tag)
	manifests := readFile(t, filepath.Join(out, manifestsName))
	if withoutHeader(manifests) != helm {
		t.Errorf("the release manifests are not what helm renders from the release's chart package")
	}
	if !strings.Contains(manifests, "image: ghcr.io/resmgr/resmgr:"+version+"\n") {
		t.Errorf("the release manifests do not use %s as the image tag", version)
	}

	// The dashboard and the alerts are the repository's.
	for name, source := range map[string]string{dashboardName: "dashboard.json", alertsName: "alerts.yaml"} {
		if readFile(t, filepath.Join(out, name)) != readFile(t, filepath.Join(root, "deploy", "monitoring", source)) {
			t.Errorf("%s is not deploy/monitoring/%s", name, source)
		}
	}
}

// `cargo xtask release` refuses to ship an agent that holds the crash test's hook: the tests
// package's resmgr-crashing, the agent that aborts at the point RESMGR_CRASH_AT names (which the
// Go agent suite kills mid-handover), fails the release before anything is written.
func TestReleaseRefusesTheAgentWithTheCrashHook(t *testing.T) {
	crashing := filepath.Join(filepath.Dir(resmgrBinary(t)), "resmgr-crashing")
	if os.Getenv("RESMGR_BIN_DIR") == "" {
		build := exec.Command("cargo", "build", "-p", "integration-tests", "--bin", "resmgr-crashing")
		build.Dir = repoRoot(t)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			t.Fatalf("building resmgr-crashing: %v", err)
		}
	}
	out := filepath.Join(t.TempDir(), "dist")
	cmd := exec.Command(xtask(t), "release", "--out", out, "--binary", crashing, "--no-image")
	cmd.Dir = repoRoot(t)
	output, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("xtask release shipped resmgr-crashing:\n%s", output)
	}
	if !strings.Contains(string(output), "holds `RESMGR_CRASH_AT`") {
		t.Fatalf("xtask release failed, but not for the crash hook: %v\n%s", err, output)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("xtask release wrote %s before refusing the binary (%v)", out, err)
	}
}
