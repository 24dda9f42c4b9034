// Package chart renders and packages resmgr's Helm chart with Helm's own code, so that what
// `cargo xtask manifests` writes and `cargo xtask release` ships is exactly what `helm template`
// and `helm package` would produce: Helm's loader, its values coalescing and values.schema.json
// validation, its template engine (every Sprig function, `include`, `toYaml`, `required`), its
// kubeVersion check and its install-order sorting of the rendered objects.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	helmchart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"helm.sh/helm/v4/pkg/strvals"
)

// DefaultKubeVersion is the Kubernetes version templates see as .Capabilities.KubeVersion and
// that Chart.yaml's kubeVersion is checked against, unless Options say otherwise: the oldest
// release the chart supports, so that the rendering does not depend on the Helm build.
const DefaultKubeVersion = "v1.34.0"

// Chart is a chart as Helm loads it.
type Chart = helmchart.Chart

// Options are what `helm template` takes besides the chart.
type Options struct {
	// ReleaseName and Namespace are `helm template NAME --namespace NS`.
	ReleaseName string
	Namespace   string
	// ValueFiles are `-f FILE`, in order (later files win).
	ValueFiles []string
	// SetStrings are `--set-string KEY=VALUE`, applied after the files.
	SetStrings []string
	// KubeVersion is `--kube-version`; empty means DefaultKubeVersion.
	KubeVersion string
}

// Load loads a chart from a directory or a packaged .tgz, as Helm does.
func Load(path string) (*Chart, error) {
	c, err := loader.Load(path)
	if err != nil {
		return nil, fmt.Errorf("loading the chart %s: %w", path, err)
	}
	return c, nil
}

// Values merges the value files and --set-string assignments of o the way the helm command does.
func (o Options) Values() (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range o.ValueFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading values: %w", err)
		}
		v, err := common.ReadValues(b)
		if err != nil {
			return nil, fmt.Errorf("values file %s: %w", f, err)
		}
		vals = loader.MergeMaps(vals, v)
	}
	for _, s := range o.SetStrings {
		if err := strvals.ParseIntoString(s, vals); err != nil {
			return nil, fmt.Errorf("--set-string %s: %w", s, err)
		}
	}
	return vals, nil
}

// Template renders c as `helm template` does and returns its output: every object, in Helm's
// install order, headed by `---` and `# Source: <template>`. Unlike `helm template`, the engine
// is strict (a template that reads a value the chart does not define is an error, which
// catches a misspelled value in a template) and a chart with hooks is refused (the plain
// manifests could not run them).
func Template(c *Chart, o Options) (string, error) {
	if o.ReleaseName == "" || o.Namespace == "" {
		return "", errors.New("a release name and a namespace are needed")
	}
	kv := o.KubeVersion
	if kv == "" {
		kv = DefaultKubeVersion
	}
	kubeVersion, err := common.ParseKubeVersion(kv)
	if err != nil {
		return "", fmt.Errorf("kube version %q: %w", kv, err)
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kubeVersion
	if want := c.Metadata.KubeVersion; want != "" && !chartutil.IsCompatibleRange(want, kubeVersion.String()) {
		return "", fmt.Errorf("chart requires kubeVersion %s, which is incompatible with Kubernetes %s", want, kubeVersion.String())
	}
	vals, err := o.Values()
	if err != nil {
		return "", err
	}
	top, err := util.ToRenderValuesWithSchemaValidation(c, vals, common.ReleaseOptions{
		Name:      o.ReleaseName,
		Namespace: o.Namespace,
		Revision:  1,
		IsInstall: true,
	}, caps, false)
	if err != nil {
		return "", err
	}
	files, err := engine.Engine{Strict: true}.Render(c, top)
	if err != nil {
		return "", err
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", fmt.Errorf("the rendered templates are not Kubernetes objects: %w", err)
	}
	if len(hooks) != 0 {
		return "", fmt.Errorf("%s renders a hook (%s): hooks are outside what the plain manifests can express", hooks[0].Path, hooks[0].Name)
	}
	var out bytes.Buffer
	for _, m := range manifests {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return out.String(), nil
}

// Package writes c as `<name>-<version>.tgz` into outDir with Helm's own packaging, and returns
// the file's path. Every file is stamped with the time mtime (so that the archive is the same
// bytes for the same chart; `helm package` would stamp the files' modification times).
func Package(c *Chart, outDir string, mtime time.Time) (string, error) {
	c.ModTime = mtime
	c.SchemaModTime = mtime
	for _, files := range [][]*common.File{c.Raw, c.Templates, c.Files} {
		for _, f := range files {
			f.ModTime = mtime
		}
	}
	if len(c.Dependencies()) != 0 {
		return "", errors.New("the chart has dependencies, which packaging does not stamp")
	}
	return chartutil.Save(c, outDir)
}

// SourceDateEpoch is the time the reproducible-builds convention asks for: $SOURCE_DATE_EPOCH
// when set, else the Unix epoch.
func SourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: not a number of seconds", s)
	}
	return time.Unix(n, 0).UTC(), nil
}
