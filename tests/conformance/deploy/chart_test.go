package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	yaml3 "go.yaml.in/yaml/v3"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/resmgr/resmgr/tools/helm-chart/go/chart"
)

// valuesSets are the values the chart is checked with: its defaults, the plain manifests', and
// every file in the chart's ci/ directory (every optional object on, every one off, IPv6
// addresses), by name.
func valuesSets(t *testing.T) map[string][]string {
	t.Helper()
	root := repoRoot(t)
	sets := map[string][]string{
		"defaults": nil,
		"plain":    {filepath.Join(root, "deploy", "manifests.values.yaml")},
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "helm", "resmgr", "ci", "*-values.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("the chart's ci/ values files: %v, %v", files, err)
	}
	for _, f := range files {
		sets[strings.TrimSuffix(filepath.Base(f), "-values.yaml")] = []string{f}
	}
	return sets
}

// render renders the chart as release name in namespace with the given values files.
func render(t *testing.T, c *chart.Chart, name, namespace string, files ...string) string {
	t.Helper()
	out, err := chart.Template(c, chart.Options{ReleaseName: name, Namespace: namespace, ValueFiles: files})
	if err != nil {
		t.Fatalf("helm could not render the chart: %v", err)
	}
	return out
}

// splitServiceMonitors separates the ServiceMonitors (a CRD the Kubernetes schemas do not know)
// from the other objects of a rendering.
func splitServiceMonitors(t *testing.T, text string) (kube string, monitors []string) {
	t.Helper()
	var rest strings.Builder
	for _, doc := range strings.Split(text, "\n---\n") {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		if head.Kind == "ServiceMonitor" {
			monitors = append(monitors, doc)
			continue
		}
		rest.WriteString("---\n" + doc + "\n")
	}
	return rest.String(), monitors
}

// Every values set, as release resmgr in resmgr-system and as release agent in kube-system,
// renders objects that match the Kubernetes 1.34 schemas (strictly), and ServiceMonitors that
// decode strictly into the Prometheus Operator's type.
func TestChartOutputMatchesTheKubernetes134Schemas(t *testing.T) {
	c := loadChart(t)
	for name, files := range valuesSets(t) {
		for _, ns := range []string{"resmgr-system", "kube-system"} {
			t.Run(name+"/"+ns, func(t *testing.T) {
				kube, monitors := splitServiceMonitors(t, render(t, c, "agent", ns, files...))
				requireValid(t, name, []byte(kube), 3)
				for _, m := range monitors {
					var sm monitoringv1.ServiceMonitor
					decodeStrict(t, "the ServiceMonitor", []byte(m), &sm)
					if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" {
						t.Errorf("the ServiceMonitor scrapes %+v", sm.Spec.Endpoints)
					}
				}
				if name == "everything-on" && len(monitors) != 1 {
					t.Errorf("%d ServiceMonitors with everything on", len(monitors))
				}
			})
		}
	}
}

// The admission policy works for any release name, namespace and driver name: the agent's own
// service account may write its node's slices of its driver, and only those.
func TestAdmissionPolicyFollowsTheReleaseAndTheDriver(t *testing.T) {
	on := filepath.Join(repoRoot(t), "deploy", "helm", "resmgr", "ci", "everything-on-values.yaml")
	text := render(t, loadChart(t), "cpu-agent", "kube-system", on)
	p := compilePolicyIn(t, text)
	var ds appsv1.DaemonSet
	objectIn(t, text, "DaemonSet", &ds)
	user := "system:serviceaccount:kube-system:" + ds.Spec.Template.Spec.ServiceAccountName
	if user != "system:serviceaccount:kube-system:cpu-agent" {
		t.Fatalf("the agent runs as %s", user)
	}
	const driver = "cpus.example.com"
	if d := p.evaluate(t, admissionRequest("CREATE", user, "node-a"), slice("node-a", driver), nil); !d.matched || len(d.denials) != 0 {
		t.Errorf("own slice: matched %v, denied %v", d.matched, d.denials)
	}
	if d := p.evaluate(t, admissionRequest("CREATE", user, "node-a"), slice("node-a", ourDriver), nil); len(d.denials) == 0 {
		t.Error("a slice of the default driver was allowed to an agent of another driver")
	}
	if d := p.evaluate(t, admissionRequest("CREATE", "system:serviceaccount:resmgr-system:resmgr", "node-a"), slice("node-b", driver), nil); d.matched {
		t.Error("the policy applies to another release's agent")
	}
}

var (
	resmgrOnce sync.Once
	resmgrPath string
	resmgrErr  error
)

// resmgrBinary is the agent: from RESMGR_BIN_DIR when `cargo xtask test` set it, else built.
func resmgrBinary(t *testing.T) string {
	t.Helper()
	resmgrOnce.Do(func() {
		if dir := os.Getenv("RESMGR_BIN_DIR"); dir != "" {
			resmgrPath = filepath.Join(dir, "resmgr")
			_, resmgrErr = os.Stat(resmgrPath)
			return
		}
		build := exec.Command("cargo", "build", "-p", "plugin-bin")
		build.Dir = repoRoot(t)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if resmgrErr = build.Run(); resmgrErr != nil {
			return
		}
		resmgrPath = filepath.Join(filepath.Dir(xtask(t)), "resmgr")
	})
	if resmgrErr != nil {
		t.Fatalf("the resmgr binary is needed: %v", resmgrErr)
	}
	return resmgrPath
}

// configFile is the agent's config file the chart renders into its ConfigMap.
func configFile(t *testing.T, text string) string {
	t.Helper()
	var cm corev1.ConfigMap
	objectIn(t, text, "ConfigMap", &cm)
	file, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("the ConfigMap holds %v, not config.yaml", cm.Data)
	}
	return file
}

// settings reads a config file (or what --print-config prints) as key -> value, keys in the
// file's kebab case. It reads YAML 1.2, as the agent does (YAML 1.1 would read `off` as false).
func settings(t *testing.T, text []byte) map[string]any {
	t.Helper()
	var raw map[string]any
	if err := yaml3.Unmarshal(text, &raw); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	out := map[string]any{}
	for k, v := range raw {
		out[strings.ReplaceAll(k, "_", "-")] = v
	}
	delete(out, "apiVersion")
	delete(out, "kind")
	return out
}

// For every values set, the agent accepts the config file the chart renders (no unknown key, no
// bad value) and runs with exactly the values it states; and every setting the agent has is
// either in the file or listed under config in values.yaml (empty: the agent's default), except
// the ones the pod gives it (node-name from the downward API, kubeconfig from the service
// account): the chart cannot fall behind the agent's settings.
func TestTheAgentRunsWithTheChartsConfigFile(t *testing.T) {
	bin := resmgrBinary(t)
	c := loadChart(t)
	listed, ok := c.Values["config"].(map[string]any)
	if !ok {
		t.Fatal("values.yaml has no config map")
	}
	for name, files := range valuesSets(t) {
		t.Run(name, func(t *testing.T) {
			file := configFile(t, render(t, c, "resmgr", "resmgr-system", files...))
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "run", "--print-config", "--config", path, "--node-name", "node-1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("the agent refuses the chart's config file: %v\n%s\n%s", err, stderr.String(), file)
			}
			stated := settings(t, []byte(file))
			resolved := settings(t, out)
			for key, value := range stated {
				if got, ok := resolved[key]; !ok || fmt.Sprint(got) != fmt.Sprint(value) {
					t.Errorf("the file says %s: %v, the agent runs with %v", key, value, got)
				}
			}
			for key, value := range resolved {
				_, inFile := stated[key]
				_, inValues := listed[key]
				if !inFile && !inValues && key != "node-name" && key != "kubeconfig" {
					t.Errorf("the chart knows nothing of %s (the agent's default is %v): add it to values.yaml's config", key, value)
				}
			}
		})
	}
}

// The schema turns a typo or a wrong type into an install error naming the value.
func TestTheSchemaRefusesWhatTheChartWouldMisread(t *testing.T) {
	c := loadChart(t)
	cases := map[string]string{
		"nodeSelectr":   "nodeSelectr: {a: b}\n",
		"reserved-cpu":  "config: {reserved-cpu: \"2\"}\n",
		"cdi-dir":       "config: {cdi-dir: /etc/cdi}\n",
		"port":          "metrics: {port: \"8891\"}\n",
		"maxSurge":      "updateStrategy: {rollingUpdate: {maxUnavailable: 1, maxSurge: -1}}\n",
		"operater":      "tolerations: [{operater: Exists}]\n",
		"seLinuxOption": "securityContext: {seLinuxOption: {type: spc_t}}\n",
		"pullPolicy":    "image: {pullPolicy: Sometimes}\n",
		"log-format":    "config: {log-format: xml}\n",
	}
	for want, values := range cases {
		t.Run(want, func(t *testing.T) {
			_, err := chart.Template(c, chart.Options{ReleaseName: "r", Namespace: "n", ValueFiles: []string{valuesFile(t, "typo", values)}})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("want an error naming %q, got %v", want, err)
			}
		})
	}
}

// Without the schema (helm install --skip-schema-validation), the templates still refuse a
// setting under config that the chart derives from its own values.
func TestTheTemplatesRefuseADerivedSettingUnderConfig(t *testing.T) {
	c := loadChart(t)
	c.Schema = nil
	_, err := chart.Template(c, chart.Options{ReleaseName: "r", Namespace: "n", ValueFiles: []string{valuesFile(t, "derived", "config: {state-dir: /tmp}\n")}})
	if err == nil || !strings.Contains(err.Error(), "config.state-dir") {
		t.Fatalf("got %v", err)
	}
	for _, key := range []string{"driver-name", "nri-socket", "kubelet-plugins-dir", "kubelet-registry-dir", "cdi-dir", "state-dir", "metrics-addr", "debug-addr"} {
		if !slices.Contains(strings.Fields(strings.NewReplacer(":", " ", "\n", " ").Replace(configFile(t, render(t, c, "r", "n")))), key) {
			t.Errorf("the chart does not derive %s", key)
		}
	}
}

// `helm lint` (Helm's own lint rules: Chart.yaml, values against the schema, every template
// rendered and parsed as Kubernetes objects with valid names) finds nothing worse than advice,
// for every values set.
func TestHelmLintFindsNoWarning(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "deploy", "helm", "resmgr")
	kubeVersion, err := common.ParseKubeVersion(chart.DefaultKubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for name, files := range valuesSets(t) {
		t.Run(name, func(t *testing.T) {
			values, err := chart.Options{ValueFiles: files}.Values()
			if err != nil {
				t.Fatal(err)
			}
			result := lint.RunAll(dir, values, "resmgr-system", lint.WithKubeVersion(kubeVersion))
			for _, m := range result.Messages {
				if m.Severity >= support.WarningSev {
					t.Error(m)
				} else {
					t.Log(m)
				}
			}
		})
	}
}
