package deploy

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
)

// helmRender renders a loaded chart with Helm's engine in strict mode (a missing value is an
// error), as `helm template --namespace resmgr-system resmgr` with the given values files would,
// and returns template path -> trimmed text for every template that produced anything.
func helmRender(t *testing.T, c *chart.Chart, valueFiles ...string) map[string]string {
	t.Helper()
	vals := map[string]any{}
	for _, f := range valueFiles {
		v, err := common.ReadValuesFile(f)
		if err != nil {
			t.Fatalf("reading %s: %v", f, err)
		}
		mergeValues(vals, v)
	}
	top, err := util.ToRenderValues(c, vals, common.ReleaseOptions{
		Name:      plainReleaseName,
		Namespace: plainNamespace,
		IsInstall: true,
	}, nil)
	if err != nil {
		t.Fatalf("composing render values: %v", err)
	}
	out, err := engine.Engine{Strict: true}.Render(c, top)
	if err != nil {
		t.Fatalf("helm could not render the chart: %v", err)
	}
	rendered := map[string]string{}
	for name, text := range out {
		if text = strings.TrimSpace(text); text != "" {
			rendered[name] = text
		}
	}
	return rendered
}

// mergeValues deep-merges src into dst, as Helm merges several -f files.
func mergeValues(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(filepath.Join(repoRoot(t), "deploy", "helm", "resmgr"))
	if err != nil {
		t.Fatalf("helm could not load the chart: %v", err)
	}
	return c
}

// templateDifferences lists how two renderings differ: templates only one has, and templates
// whose text differs.
func templateDifferences(helm, ours map[string]string) []string {
	var diffs []string
	for _, name := range slices.Sorted(maps.Keys(helm)) {
		text, ok := ours[name]
		switch {
		case !ok:
			diffs = append(diffs, "only helm renders "+name)
		case text != helm[name]:
			diffs = append(diffs, name+" differs\n--- helm ---\n"+helm[name]+"\n--- ours ---\n"+text)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ours)) {
		if _, ok := helm[name]; !ok {
			diffs = append(diffs, "only ours renders "+name)
		}
	}
	return diffs
}

func requireSameTemplates(t *testing.T, what string, helm, ours map[string]string) {
	t.Helper()
	for _, d := range templateDifferences(helm, ours) {
		t.Errorf("%s: %s", what, d)
	}
}

// The committed plain manifests are exactly what Helm renders from the chart with
// deploy/manifests.values.yaml: the chart and the manifests cannot drift, and our template
// subset renders these templates as Helm does.
func TestHelmRendersThePlainManifests(t *testing.T) {
	root := repoRoot(t)
	helm := helmRender(t, loadChart(t), filepath.Join(root, "deploy", "manifests.values.yaml"))
	ours := splitSources(readFile(t, filepath.Join(root, "deploy", "manifests", "resmgr.yaml")))
	if len(ours) < 6 {
		t.Fatalf("found only %d templates in the plain manifests", len(ours))
	}
	requireSameTemplates(t, "plain manifests", helm, ours)
}

// Our renderer agrees with Helm's on values that flip every option of the chart (each `if` the
// other way, every substituted value changed), not only on the committed ones.
func TestOurRendererAgreesWithHelmOnOtherValues(t *testing.T) {
	dir := t.TempDir()
	sets := map[string]string{
		"defaults": "{}\n",
		"flipped": `namespace: {create: true}
admissionPolicy: {enabled: false}
reservedCpus: "0,4"
nodeAllocatableCpu: true
driverName: cpus.example.com
deviceClass: {name: example-cpus}
image: {repository: registry.example/resmgr, tag: "9.9.9", pullPolicy: Always}
nri: {socketDir: /run/nri, pluginIndex: "10"}
kubelet: {rootDir: /data/kubelet}
cdi: {specDir: /etc/cdi}
stateDir: /data/resmgr
logFormat: text
metrics: {bindAddress: "127.0.0.1", port: 9100}
priorityClassName: system-cluster-critical
resources: {requests: {cpu: 100m, memory: 32Mi}, limits: {memory: 1Gi}}
`,
	}
	c := loadChart(t)
	for name, values := range sets {
		t.Run(name, func(t *testing.T) {
			valuesFile := filepath.Join(dir, name+".yaml")
			if err := os.WriteFile(valuesFile, []byte(values), 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, name+"-rendered.yaml")
			runXtask(t, "manifests", "--values", valuesFile, "--out", out)
			ours := splitSources(readFile(t, out))
			helm := helmRender(t, c, valuesFile)
			requireSameTemplates(t, name, helm, ours)
			if name == "flipped" && !strings.Contains(ours["resmgr/templates/50-daemonset.yaml"], "--reserved-cpus=0,4") {
				t.Errorf("the flipped values did not reach the DaemonSet")
			}
		})
	}
}

// A template that renders differently is reported: the comparison is not vacuous.
func TestTemplateComparisonCatchesADifference(t *testing.T) {
	root := repoRoot(t)
	helm := helmRender(t, loadChart(t), filepath.Join(root, "deploy", "manifests.values.yaml"))
	ours := splitSources(readFile(t, filepath.Join(root, "deploy", "manifests", "resmgr.yaml")))
	if d := templateDifferences(helm, ours); len(d) != 0 {
		t.Fatalf("unexpected differences before the change: %v", d)
	}
	name := "resmgr/templates/50-daemonset.yaml"
	ours[name] = strings.Replace(ours[name], "maxUnavailable: 1", "maxUnavailable: 2", 1)
	delete(ours, "resmgr/templates/00-namespace.yaml")
	d := templateDifferences(helm, ours)
	if len(d) != 2 || !strings.HasPrefix(d[0], "only helm renders resmgr/templates/00-namespace.yaml") ||
		!strings.HasPrefix(d[1], name+" differs") {
		t.Fatalf("differences not reported as expected: %q", d)
	}
}
