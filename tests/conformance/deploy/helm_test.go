package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resmgr/resmgr/tools/helm-chart/go/chart"
)

// helmRender renders a chart with the code `cargo xtask manifests` runs (tools/helm-chart/go: Helm's
// loader, schema validation, strict engine and install-order sort), as `helm template
// --namespace resmgr-system resmgr` with the given values files would, and returns its output.
func helmRender(t *testing.T, c *chart.Chart, valueFiles ...string) string {
	t.Helper()
	out, err := chart.Template(c, chart.Options{
		ReleaseName: plainReleaseName,
		Namespace:   plainNamespace,
		ValueFiles:  valueFiles,
	})
	if err != nil {
		t.Fatalf("helm could not render the chart: %v", err)
	}
	return out
}

// valuesFile writes a values file with the given YAML into the test's temporary directory.
func valuesFile(t *testing.T, name, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := chart.Load(filepath.Join(repoRoot(t), "deploy", "helm", "resmgr"))
	if err != nil {
		t.Fatalf("helm could not load the chart: %v", err)
	}
	return c
}

// withoutHeader is a manifests file without the comment lines before its first object.
func withoutHeader(text string) string {
	if i := strings.Index(text, "---\n"); i >= 0 {
		return text[i:]
	}
	return text
}
