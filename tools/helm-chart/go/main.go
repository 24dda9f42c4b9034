// Command helm-chart is how `cargo xtask` renders and packages resmgr's Helm chart with Helm's
// own code (package chart) rather than an imitation of it:
//
//	helm-chart template --chart DIR --release NAME --namespace NS [-f FILE]... [--set-string K=V]... [--kube-version V]
//	helm-chart package --chart DIR --out DIR
//
// template prints what `helm template` prints; package writes `<name>-<version>.tgz` as `helm
// package` does, with every file stamped $SOURCE_DATE_EPOCH (default: the Unix epoch), and
// prints its path.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/resmgr/resmgr/tools/helm-chart/go/chart"
)

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return fmt.Sprint(*r) }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "helm-chart:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: helm-chart template|package [flags]")
	}
	fs := flag.NewFlagSet("helm-chart "+args[0], flag.ContinueOnError)
	dir := fs.String("chart", "", "the chart: a directory or a packaged .tgz")
	switch args[0] {
	case "template":
		var o chart.Options
		var values, sets repeated
		fs.StringVar(&o.ReleaseName, "release", "", "the release name")
		fs.StringVar(&o.Namespace, "namespace", "", "the release namespace")
		fs.StringVar(&o.KubeVersion, "kube-version", chart.DefaultKubeVersion, "the Kubernetes version the chart is rendered for")
		fs.Var(&values, "f", "a values file (repeatable, later files win)")
		fs.Var(&sets, "set-string", "KEY=VALUE, as helm's --set-string (repeatable)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		o.ValueFiles, o.SetStrings = values, sets
		c, err := load(*dir, fs)
		if err != nil {
			return err
		}
		out, err := chart.Template(c, o)
		if err != nil {
			return err
		}
		_, err = os.Stdout.WriteString(out)
		return err
	case "package":
		out := fs.String("out", "", "the directory to write the package into")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *out == "" {
			return errors.New("package: --out is needed")
		}
		c, err := load(*dir, fs)
		if err != nil {
			return err
		}
		mtime, err := chart.SourceDateEpoch()
		if err != nil {
			return err
		}
		path, err := chart.Package(c, *out, mtime)
		if err != nil {
			return err
		}
		fmt.Println(path)
		return nil
	default:
		return fmt.Errorf("unknown command %q: template or package", args[0])
	}
}

func load(dir string, fs *flag.FlagSet) (*chart.Chart, error) {
	if dir == "" {
		return nil, errors.New(fs.Name() + ": --chart is needed")
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("%s: unexpected arguments %v", fs.Name(), fs.Args())
	}
	return chart.Load(dir)
}
