package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/yannh/kubeconform/pkg/validator"
)

// The Kubernetes release whose OpenAPI document the objects are validated against. The module
// zip of k8s.io/kubernetes carries api/openapi-spec/swagger.json; the Go module proxy serves it,
// and its hash is pinned here (and checked by the go command against the checksum database).
const (
	kubernetesModule     = "k8s.io/kubernetes"
	kubernetesVersion    = "v1.34.4"
	kubernetesModuleHash = "h1:Yy6R4QB8C9kJPp25GFqEvX5XQwY5qzKeqD0Xx6oAcmk="
)

var (
	schemasOnce sync.Once
	schemasDir  string
	schemasErr  error
)

// schemas returns a directory of strict JSON schemas, one per kind of the Kubernetes OpenAPI
// document, named the way the kubeconform location template below expects.
func schemas(t *testing.T) string {
	t.Helper()
	schemasOnce.Do(func() {
		spec, err := openAPIDocument()
		if err != nil {
			schemasErr = err
			return
		}
		dir, err := os.MkdirTemp("", "resmgr-k8s-schemas-")
		if err != nil {
			schemasErr = err
			return
		}
		schemasDir = dir
		schemasErr = writeStrictSchemas(spec, dir)
	})
	if schemasErr != nil {
		t.Fatalf("the Kubernetes %s schemas are needed: %v", kubernetesVersion, schemasErr)
	}
	return schemasDir
}

// openAPIDocument fetches the pinned k8s.io/kubernetes module through the go command and reads
// its swagger.json.
func openAPIDocument() ([]byte, error) {
	cmd := exec.Command("go", "mod", "download", "-json", kubernetesModule+"@"+kubernetesVersion)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download %s@%s: %v\n%s", kubernetesModule, kubernetesVersion, err, stderr.String())
	}
	var mod struct {
		Dir, Sum, Error string
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, err
	}
	if mod.Error != "" {
		return nil, fmt.Errorf("go mod download: %s", mod.Error)
	}
	if mod.Sum != kubernetesModuleHash {
		return nil, fmt.Errorf("%s@%s has hash %s, pinned %s", kubernetesModule, kubernetesVersion, mod.Sum, kubernetesModuleHash)
	}
	return os.ReadFile(filepath.Join(mod.Dir, "api", "openapi-spec", "swagger.json"))
}

// schemaLocation is the kubeconform location template for the schemas written below.
func schemaLocation(dir string) string {
	return filepath.Join(dir, "{{ .ResourceKind }}_{{ .Group }}_{{ .ResourceAPIVersion }}.json")
}

// writeStrictSchemas writes, for every kind in the OpenAPI document's definitions, a JSON schema
// holding that kind's definition and every definition it reaches. It is strict the way
// kubeconform's published "-strict" schemas are: every object with declared properties allows no
// others. Two types whose JSON the API server accepts in two forms are widened to both:
// IntOrString (string or integer) and Quantity (string or number).
func writeStrictSchemas(spec []byte, dir string) error {
	var doc struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(spec, &doc); err != nil {
		return fmt.Errorf("parsing swagger.json: %w", err)
	}
	defs := doc.Definitions
	defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = map[string]any{
		"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}},
	}
	defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{
		"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}},
	}
	for _, def := range defs {
		forbidUnknownProperties(def)
	}
	for name, def := range defs {
		gvks, _ := def.(map[string]any)["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			apiVersion := version
			if group != "" {
				apiVersion = group + "/" + version
			}
			parts := strings.Split(apiVersion, "/")
			file := fmt.Sprintf("%s_%s_%s.json", strings.ToLower(kind), parts[0], parts[len(parts)-1])
			schema := map[string]any{
				"$ref":        "#/definitions/" + name,
				"definitions": reachable(defs, name),
			}
			b, err := json.Marshal(schema)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// forbidUnknownProperties sets additionalProperties: false on every object schema under s that
// declares properties and says nothing about others.
func forbidUnknownProperties(s any) {
	switch v := s.(type) {
	case map[string]any:
		if _, ok := v["properties"]; ok {
			if _, set := v["additionalProperties"]; !set {
				v["additionalProperties"] = false
			}
		}
		for _, child := range v {
			forbidUnknownProperties(child)
		}
	case []any:
		for _, child := range v {
			forbidUnknownProperties(child)
		}
	}
}

// reachable returns the definitions reachable from root through $ref.
func reachable(defs map[string]any, root string) map[string]any {
	out := map[string]any{}
	var visit func(name string)
	var walk func(s any)
	visit = func(name string) {
		if _, seen := out[name]; seen {
			return
		}
		def, ok := defs[name]
		if !ok {
			return
		}
		out[name] = def
		walk(def)
	}
	walk = func(s any) {
		switch v := s.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				visit(strings.TrimPrefix(ref, "#/definitions/"))
			}
			for _, child := range v {
				walk(child)
			}
		case []any:
			for _, child := range v {
				walk(child)
			}
		}
	}
	visit(root)
	return out
}

// validate runs kubeconform over a multi-document file and returns, per object, "Kind name" for
// valid ones and the failures.
func validate(t *testing.T, name string, text []byte) (valid []string, failures []string) {
	t.Helper()
	v, err := validator.New([]string{schemaLocation(schemas(t))}, validator.Opts{
		Strict:            true,
		KubernetesVersion: strings.TrimPrefix(kubernetesVersion, "v"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range v.Validate(name, io.NopCloser(bytes.NewReader(text))) {
		sig, _ := res.Resource.Signature()
		what := "document"
		if sig != nil {
			what = sig.Kind + " " + sig.Name
		}
		switch res.Status {
		case validator.Valid:
			valid = append(valid, what)
		case validator.Empty:
		default:
			msg := fmt.Sprintf("%s: %s: %v", name, what, res.Err)
			for _, e := range res.ValidationErrors {
				msg += fmt.Sprintf("\n    %s: %s", e.Path, e.Msg)
			}
			failures = append(failures, msg)
		}
	}
	return valid, failures
}

// requireValid validates text and requires every object to be valid, and at least want objects.
func requireValid(t *testing.T, name string, text []byte, want int) {
	t.Helper()
	valid, failures := validate(t, name, text)
	for _, f := range failures {
		t.Error(f)
	}
	if len(valid) < want {
		t.Errorf("%s: %d valid objects %v, want at least %d", name, len(valid), valid, want)
	}
}

func TestPlainManifestsMatchTheKubernetes134Schemas(t *testing.T) {
	path := filepath.Join(repoRoot(t), "deploy", "manifests", "resmgr.yaml")
	requireValid(t, path, []byte(readFile(t, path)), 8)
}

func TestExamplesMatchTheKubernetes134Schemas(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "examples", "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, f := range files {
		requireValid(t, f, []byte(readFile(t, f)), 2)
	}
}

// The schemas are strict and typed: an unknown field, a field of the wrong type, a missing
// required field and a field from a newer Kubernetes are all refused.
func TestSchemaValidationRefusesWhatKubernetes134Would(t *testing.T) {
	base := readFile(t, filepath.Join(repoRoot(t), "deploy", "manifests", "resmgr.yaml"))
	cases := map[string][2]string{
		"unknown field":        {"maxUnavailable: 0\n", "maxUnavailable: 0\n      maxUnavaliable: 1\n"},
		"wrong type":           {"containerPort: 8891", "containerPort: [8891]"},
		"missing required":     {"roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: resmgr\n", ""},
		"unknown policy field": {"  failurePolicy: Fail\n", "  failurePolicy: Fail\n  failureMode: Fail\n"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(base, c[0]) {
				t.Fatalf("the manifests no longer contain %q", c[0])
			}
			broken := strings.Replace(base, c[0], c[1], 1)
			_, failures := validate(t, name, []byte(broken))
			if len(failures) == 0 {
				t.Fatalf("kubeconform accepted the manifests with %s", name)
			}
			t.Logf("refused as it should be: %v", failures)
		})
	}
	// nodeAllocatableResourceMappings on a ResourceSlice device is a Kubernetes 1.36 field.
	slice := `apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-slice}
spec:
  driver: topology-aware.resmgr.io
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices:
    - name: numa0
      allowMultipleAllocations: true
      capacity:
        cpu: {value: "8"}
`
	if valid, failures := validate(t, "slice", []byte(slice)); len(failures) != 0 || len(valid) != 1 {
		t.Fatalf("a 1.34 ResourceSlice was refused: %v", failures)
	}
	newer := strings.Replace(slice, "      capacity:", "      nodeAllocatableResourceMappings:\n        cpu: {capacityKey: cpu}\n      capacity:", 1)
	if _, failures := validate(t, "newer slice", []byte(newer)); len(failures) == 0 {
		t.Fatal("a field Kubernetes 1.34 does not know was accepted")
	}
}
