package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// exportedSeries is every series name the agent exports, read from docs/metrics.md, which is
// generated from the agent's metrics and checked against what it registers ("samples `a`, `b`").
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	text := readFile(t, filepath.Join(repoRoot(t), "docs", "metrics.md"))
	series := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, "gauge; samples ")
		if !ok {
			for _, kind := range []string{"counter", "histogram", "summary", "info"} {
				if rest, ok = strings.CutPrefix(line, kind+"; samples "); ok {
					break
				}
			}
		}
		if !ok {
			continue
		}
		for _, m := range regexp.MustCompile("`([a-zA-Z_:][a-zA-Z0-9_:]*)`").FindAllStringSubmatch(rest, -1) {
			series[m[1]] = true
		}
	}
	if len(series) < 10 || !series["resmgr_ready"] {
		t.Fatalf("docs/metrics.md names only %v: has its format changed?", slices.Sorted(maps.Keys(series)))
	}
	return series
}

var promql = parser.NewParser(parser.Options{})

// unknownMetrics parses a PromQL expression and returns the metric names it selects that the
// agent does not export.
func unknownMetrics(expr string, exported map[string]bool) ([]string, error) {
	e, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var unknown []string
	selectors := 0
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		if !exported[vs.Name] {
			unknown = append(unknown, vs.Name)
		}
		return nil
	})
	if selectors == 0 {
		return nil, fmt.Errorf("%q selects no metric", expr)
	}
	return unknown, nil
}

// decodeStrict decodes YAML into out, refusing fields out's type does not have.
func decodeStrict(t *testing.T, what string, doc []byte, out any) {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s does not decode strictly: %v", what, err)
	}
}

// The alerts are a PrometheusRule the Prometheus Operator accepts, whose rules Prometheus itself
// loads (rulefmt: expressions, durations, labels and annotation templates), for exactly the seven
// conditions an operator must hear about, over metrics the agent exports.
func TestAlertsLoadInPrometheusAndNameExportedMetrics(t *testing.T) {
	exported := exportedSeries(t)
	var rule monitoringv1.PrometheusRule
	decodeStrict(t, "deploy/monitoring/alerts.yaml", []byte(readFile(t, filepath.Join(repoRoot(t), "deploy", "monitoring", "alerts.yaml"))), &rule)
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" {
		t.Fatalf("the alerts are a %s %s", rule.APIVersion, rule.Kind)
	}
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	loaded, errs := rulefmt.Parse(groups, false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, e := range errs {
		t.Errorf("prometheus refuses the rules: %v", e)
	}
	if len(errs) != 0 {
		t.FailNow()
	}
	var alerts []string
	for _, g := range loaded.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			unknown, err := unknownMetrics(r.Expr, exported)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
			}
			if len(unknown) != 0 {
				t.Errorf("%s selects %v, which the agent does not export (docs/metrics.md)", r.Alert, unknown)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s has no %s", r.Alert, a)
				}
			}
		}
	}
	want := []string{"ResmgrAgentNotReady", "ResmgrClaimsContested", "ResmgrClaimsFailing", "ResmgrNodeAllocatableRefused", "ResmgrPendingUpdatesStuck", "ResmgrPublicationFailing", "ResmgrSliceFieldsDropped"}
	if slices.Sort(alerts); !slices.Equal(alerts, want) {
		t.Errorf("alerts %v, want %v", alerts, want)
	}
}

// grafanaVariables are what Grafana substitutes into the dashboard's queries before Prometheus
// sees them.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "1m",
	"$__range", "6h",
	"$instance", ".*",
)

// The dashboard is JSON Grafana imports: unique panel ids, every query on the datasource
// variable, and every query (the panels' and the variables') a PromQL expression over metrics
// the agent exports.
func TestDashboardQueriesParseAndNameExportedMetrics(t *testing.T) {
	exported := exportedSeries(t)
	var dash struct {
		Title      string            `json:"title"`
		UID        string            `json:"uid"`
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(repoRoot(t), "deploy", "monitoring", "dashboard.json"))), &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Fatal("the dashboard has no title or uid")
	}
	type panel struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	ids := map[int]string{}
	exprs := 0
	for _, raw := range dash.Panels {
		var p panel
		if err := json.Unmarshal(raw, &p); err != nil {
			t.Fatal(err)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not query the datasource variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			exprs++
			unknown, err := unknownMetrics(grafanaVariables.Replace(target.Expr), exported)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
			}
			if len(unknown) != 0 {
				t.Errorf("panel %q selects %v, which the agent does not export", p.Title, unknown)
			}
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		text, _ := q["query"].(string)
		m := regexp.MustCompile(`^label_values\((\w+), *(\w+)\)$`).FindStringSubmatch(text)
		if m == nil || !exported[m[1]] {
			t.Errorf("variable %s: %q is not label_values over an exported metric", v.Name, text)
		}
	}
	if exprs < 10 {
		t.Errorf("only %d queries in the dashboard", exprs)
	}
}

// The check is not vacuous: a metric the agent does not export, and an expression that does not
// parse, are caught.
func TestMetricNameCheckCatchesUnknownMetricsAndBadExpressions(t *testing.T) {
	exported := exportedSeries(t)
	unknown, err := unknownMetrics(`rate(resmgr_claims_prepared_total[5m]) > 0 and resmgr_claims_failed_total > 0`, exported)
	if err != nil || !slices.Equal(unknown, []string{"resmgr_claims_failed_total"}) {
		t.Fatalf("got %v, %v", unknown, err)
	}
	if _, err := unknownMetrics(`rate(resmgr_ready[5m]`, exported); err == nil {
		t.Fatal("an unbalanced expression parsed")
	}
	if _, err := unknownMetrics(`vector(1)`, exported); err == nil {
		t.Fatal("an expression that selects nothing passed")
	}
}
