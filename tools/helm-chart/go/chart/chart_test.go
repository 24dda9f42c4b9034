package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tinyChart writes a chart of two templates (a ConfigMap before a Namespace in file order) and
// returns its directory; extra maps more template names to their text.
func tinyChart(t *testing.T, extra map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"Chart.yaml":               "apiVersion: v2\nname: tiny\nversion: 1.2.3\nkubeVersion: \">= 1.34.0-0\"\n",
		"values.yaml":              "data: {a: \"1\"}\n",
		"templates/00-config.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ .Release.Name }}, namespace: {{ .Release.Namespace }}}\ndata:\n  {{- toYaml .Values.data | nindent 2 }}\n",
		"templates/10-ns.yaml":     "apiVersion: v1\nkind: Namespace\nmetadata: {name: {{ .Release.Namespace }}}\n",
		"templates/NOTES.txt":      "installed {{ .Release.Name }}\n",
		"templates/_helpers.tpl":   "{{- define \"tiny.name\" }}tiny{{ end }}\n",
	}
	for name, text := range extra {
		files[name] = text
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func load(t *testing.T, dir string) *Chart {
	t.Helper()
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTemplatePrintsWhatHelmTemplatePrintsInInstallOrder(t *testing.T) {
	dir := tinyChart(t, nil)
	over := filepath.Join(t.TempDir(), "over.yaml")
	if err := os.WriteFile(over, []byte("data: {b: \"2\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := Template(load(t, dir), Options{ReleaseName: "r", Namespace: "ns", ValueFiles: []string{over}, SetStrings: []string{"data.c=3"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "---\n# Source: tiny/templates/10-ns.yaml\napiVersion: v1\nkind: Namespace\nmetadata: {name: ns}\n\n" +
		"---\n# Source: tiny/templates/00-config.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: r, namespace: ns}\ndata:\n  a: \"1\"\n  b: \"2\"\n  c: \"3\"\n\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
}

func TestTemplateRefusesWhatThePlainManifestsCannotHold(t *testing.T) {
	cases := map[string]struct {
		extra map[string]string
		opts  Options
		want  string
	}{
		"a hook": {
			extra: map[string]string{"templates/20-job.yaml": "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\n  annotations: {helm.sh/hook: pre-install}\n"},
			want:  "hook",
		},
		"a value the chart does not define": {
			extra: map[string]string{"templates/20-typo.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, labels: {a: {{ .Values.dta | quote }}}}\n"},
			want:  "dta",
		},
		"an older Kubernetes": {
			opts: Options{KubeVersion: "v1.33.0"},
			want: "kubeVersion",
		},
		"no namespace": {
			opts: Options{Namespace: "-"},
			want: "namespace",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			o := c.opts
			o.ReleaseName = "r"
			if o.Namespace == "" {
				o.Namespace = "ns"
			} else if o.Namespace == "-" {
				o.Namespace = ""
			}
			_, err := Template(load(t, tinyChart(t, c.extra)), o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error mentioning %q, got %v", c.want, err)
			}
		})
	}
}

func TestPackageIsReproducibleAndLoadable(t *testing.T) {
	dir := tinyChart(t, nil)
	stamp := time.Unix(1700000000, 0)
	var archives [][]byte
	for range 2 {
		path, err := Package(load(t, dir), t.TempDir(), stamp)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != "tiny-1.2.3.tgz" {
			t.Fatalf("packaged as %s", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
		packaged := load(t, path)
		if len(packaged.Templates) != 4 || packaged.Metadata.Version != "1.2.3" {
			t.Fatalf("the package holds %d templates, version %s", len(packaged.Templates), packaged.Metadata.Version)
		}
	}
	if !bytes.Equal(archives[0], archives[1]) {
		t.Fatal("the same chart packaged twice gave different bytes")
	}
}
