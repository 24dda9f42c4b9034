package deploy

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// policy is the admission policy of the plain manifests, compiled in the API server's CEL
// environment.
type policy struct {
	spec        admissionv1.ValidatingAdmissionPolicySpec
	matches     []cel.Program
	variables   []namedProgram
	validations []validation
}

type namedProgram struct {
	name string
	prog cel.Program
}

type validation struct {
	expr    cel.Program
	message string
	msgExpr cel.Program // nil when the message is static
}

// decision is what the policy says about one request.
type decision struct {
	matched bool     // the match conditions selected the request
	denials []string // the messages of the validations that failed
}

// objectOf finds the one object of kind in the plain manifests and decodes it strictly into out.
func objectOf(t *testing.T, kind string, out any) {
	t.Helper()
	objectIn(t, readFile(t, filepath.Join(repoRoot(t), "deploy", "manifests", "resmgr.yaml")), kind, out)
}

// objectIn finds the one object of kind in a multi-document text and decodes it strictly into out.
func objectIn(t *testing.T, text, kind string, out any) {
	t.Helper()
	objectNamed(t, text, kind, "", out)
}

// objectNamed finds the one object of kind whose name ends with suffix ("": any name) in a
// multi-document text and decodes it strictly into out.
func objectNamed(t *testing.T, text, kind, suffix string, out any) {
	t.Helper()
	var found []map[string]any
	for _, obj := range documents(t, text) {
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if obj["kind"] == kind && strings.HasSuffix(name, suffix) {
			found = append(found, obj)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s named *%s, found %d", kind, suffix, len(found))
	}
	b, err := yaml.Marshal(found[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, out); err != nil {
		t.Fatalf("decoding the %s: %v", kind, err)
	}
}

// The two admission policies, by the end of their names.
const (
	slicesPolicy = "-own-node-resourceslices"
	podsPolicy   = "-own-node-pods"
)

// compilePolicy compiles every expression of the slices policy the way a Kubernetes 1.34 API server
// compiles new expressions: in its base CEL environment at compatibility version 1.33 (an API
// server accepts new expressions only in the environment of its previous minor version, so that
// a rollback keeps them valid), with request, object, oldObject and variables declared.
func compilePolicy(t *testing.T) *policy {
	t.Helper()
	return compilePolicyIn(t, readFile(t, filepath.Join(repoRoot(t), "deploy", "manifests", "resmgr.yaml")))
}

// compilePolicyIn compiles the slices policy of a multi-document text, as compilePolicy does.
func compilePolicyIn(t *testing.T, text string) *policy {
	t.Helper()
	return compileNamedPolicy(t, text, slicesPolicy)
}

// compileNamedPolicy compiles the admission policy whose name ends with suffix, as compilePolicy
// does.
func compileNamedPolicy(t *testing.T, text, suffix string) *policy {
	t.Helper()
	var vap admissionv1.ValidatingAdmissionPolicy
	objectNamed(t, text, "ValidatingAdmissionPolicy", suffix, &vap)
	envSet, err := environment.MustBaseEnvSet(version.MajorMinor(1, 33)).Extend(environment.VersionedOptions{
		IntroducedVersion: version.MajorMinor(1, 30),
		EnvOptions: []cel.EnvOption{
			cel.Variable("request", cel.DynType),
			cel.Variable("object", cel.DynType),
			cel.Variable("oldObject", cel.DynType),
			cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	env := envSet.NewExpressionsEnv()
	compile := func(what, expr string, wantType *cel.Type) cel.Program {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("%s does not compile: %v\n%s", what, iss.Err(), expr)
		}
		if wantType != nil && !ast.OutputType().IsAssignableType(wantType) && ast.OutputType() != cel.DynType {
			t.Fatalf("%s has type %s, want %s", what, ast.OutputType(), wantType)
		}
		prog, err := env.Program(ast)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return prog
	}
	p := &policy{spec: vap.Spec}
	for _, m := range vap.Spec.MatchConditions {
		p.matches = append(p.matches, compile("match condition "+m.Name, m.Expression, cel.BoolType))
	}
	for _, v := range vap.Spec.Variables {
		p.variables = append(p.variables, namedProgram{v.Name, compile("variable "+v.Name, v.Expression, nil)})
	}
	for i, v := range vap.Spec.Validations {
		val := validation{expr: compile(fmt.Sprintf("validation %d", i), v.Expression, cel.BoolType), message: v.Message}
		if v.MessageExpression != "" {
			val.msgExpr = compile(fmt.Sprintf("validation %d message", i), v.MessageExpression, cel.StringType)
		}
		p.validations = append(p.validations, val)
	}
	return p
}

// evaluate applies the policy to one request: match conditions, then variables in order, then
// every validation, as the admission plugin does (an evaluation error counts as a denial, since
// failurePolicy is Fail).
func (p *policy) evaluate(t *testing.T, request, object, oldObject map[string]any) decision {
	t.Helper()
	vars := map[string]any{}
	activation := map[string]any{
		"request":   request,
		"object":    object,
		"oldObject": oldObject,
		"variables": vars,
	}
	for _, m := range p.matches {
		out, _, err := m.Eval(activation)
		if err != nil {
			return decision{matched: true, denials: []string{"match condition error: " + err.Error()}}
		}
		if out.Value() != true {
			return decision{}
		}
	}
	for _, v := range p.variables {
		out, _, err := v.prog.Eval(activation)
		if err != nil {
			return decision{matched: true, denials: []string{"variable " + v.name + ": " + err.Error()}}
		}
		vars[v.name] = out
	}
	d := decision{matched: true}
	for _, v := range p.validations {
		out, _, err := v.expr.Eval(activation)
		if err != nil {
			d.denials = append(d.denials, "evaluation error: "+err.Error())
			continue
		}
		if out.Value() == true {
			continue
		}
		msg := v.message
		if v.msgExpr != nil {
			m, _, err := v.msgExpr.Eval(activation)
			if err != nil {
				t.Fatalf("a message expression failed: %v", err)
			}
			msg = fmt.Sprint(m.Value())
		}
		d.denials = append(d.denials, msg)
	}
	return d
}

// agentUser is the service account the DaemonSet runs as, from the manifests themselves.
func agentUser(t *testing.T) string {
	t.Helper()
	var ds appsv1.DaemonSet
	objectOf(t, "DaemonSet", &ds)
	return "system:serviceaccount:" + ds.Namespace + ":" + ds.Spec.Template.Spec.ServiceAccountName
}

func admissionRequest(op, username, node string) map[string]any {
	extra := map[string]any{}
	if node != "" {
		extra["authentication.kubernetes.io/node-name"] = []any{node}
	}
	return map[string]any{
		"operation": op,
		"userInfo":  map[string]any{"username": username, "extra": extra},
	}
}

func slice(node, driver string) map[string]any {
	spec := map[string]any{"driver": driver, "pool": map[string]any{"name": node, "generation": 1, "resourceSliceCount": 1}}
	if node != "" {
		spec["nodeName"] = node
	} else {
		spec["allNodes"] = true
	}
	return map[string]any{
		"apiVersion": "resource.k8s.io/v1",
		"kind":       "ResourceSlice",
		"metadata":   map[string]any{"name": node + "-slice"},
		"spec":       spec,
	}
}

const ourDriver = "topology-aware.resmgr.io"

// objects returns (object, oldObject) for an operation on a slice, as the API server passes them.
func objects(op string, before, after map[string]any) (map[string]any, map[string]any) {
	switch op {
	case "CREATE":
		return after, nil
	case "DELETE":
		return nil, before
	default:
		return after, before
	}
}

func TestAdmissionPolicyLetsTheAgentWriteItsOwnNodesSlices(t *testing.T) {
	p := compilePolicy(t)
	user := agentUser(t)
	for _, op := range []string{"CREATE", "UPDATE", "DELETE"} {
		obj, old := objects(op, slice("node-a", ourDriver), slice("node-a", ourDriver))
		d := p.evaluate(t, admissionRequest(op, user, "node-a"), obj, old)
		if !d.matched {
			t.Fatalf("%s: the policy does not apply to the agent's own requests", op)
		}
		if len(d.denials) != 0 {
			t.Errorf("%s of the agent's own node's slice denied: %v", op, d.denials)
		}
	}
}

func TestAdmissionPolicyDeniesTheAgentOtherNodesSlices(t *testing.T) {
	p := compilePolicy(t)
	user := agentUser(t)
	for _, op := range []string{"CREATE", "UPDATE", "DELETE"} {
		obj, old := objects(op, slice("node-b", ourDriver), slice("node-b", ourDriver))
		d := p.evaluate(t, admissionRequest(op, user, "node-a"), obj, old)
		if len(d.denials) == 0 {
			t.Errorf("%s of node-b's slice by the agent on node-a was allowed", op)
			continue
		}
		if !strings.Contains(strings.Join(d.denials, "; "), "node node-b") {
			t.Errorf("%s: the denial does not name the other node: %v", op, d.denials)
		}
	}
}

func TestAdmissionPolicyDeniesEverythingElseTheAgentMightTry(t *testing.T) {
	p := compilePolicy(t)
	user := agentUser(t)
	cases := []struct {
		name        string
		op          string
		requestNode string
		before      map[string]any
		after       map[string]any
		wantInMsg   string
	}{
		{"token without node claim", "CREATE", "", nil, slice("node-a", ourDriver), "carries no node name"},
		{"slice for all nodes", "CREATE", "node-a", nil, slice("", ourDriver), "no single node"},
		{"another driver's slice", "CREATE", "node-a", nil, slice("node-a", "gpu.example.com"), "gpu.example.com"},
		{"another driver's slice, deleted", "DELETE", "node-a", slice("node-a", "gpu.example.com"), nil, "gpu.example.com"},
		{"moving another node's slice to ours", "UPDATE", "node-a", slice("node-b", ourDriver), slice("node-a", ourDriver), "take over"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			obj, old := objects(c.op, c.before, c.after)
			d := p.evaluate(t, admissionRequest(c.op, user, c.requestNode), obj, old)
			if !d.matched || len(d.denials) == 0 {
				t.Fatalf("allowed (matched %v)", d.matched)
			}
			if !strings.Contains(strings.Join(d.denials, "; "), c.wantInMsg) {
				t.Fatalf("denied, but no message mentions %q: %v", c.wantInMsg, d.denials)
			}
		})
	}
}

func TestAdmissionPolicyLeavesOtherUsersAlone(t *testing.T) {
	p := compilePolicy(t)
	for _, user := range []string{
		"system:node:node-a", // the kubelet wipes slices at its start
		"system:serviceaccount:other:resmgr",
		"system:serviceaccount:" + plainNamespace + ":other",
		"admin",
	} {
		d := p.evaluate(t, admissionRequest("DELETE", user, "node-a"), nil, slice("node-b", ourDriver))
		if d.matched {
			t.Errorf("the policy applied to %s", user)
		}
	}
}

func TestAdmissionPolicyIsBoundAndCoversEveryWrite(t *testing.T) {
	p := compilePolicy(t)
	manifests := readFile(t, filepath.Join(repoRoot(t), "deploy", "manifests", "resmgr.yaml"))
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	objectNamed(t, manifests, "ValidatingAdmissionPolicyBinding", slicesPolicy, &binding)
	var vap admissionv1.ValidatingAdmissionPolicy
	objectNamed(t, manifests, "ValidatingAdmissionPolicy", slicesPolicy, &vap)
	if binding.Spec.PolicyName != vap.Name {
		t.Errorf("the binding names policy %q, the policy is %q", binding.Spec.PolicyName, vap.Name)
	}
	if len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != admissionv1.Deny {
		t.Errorf("validation actions %v, want [Deny]", binding.Spec.ValidationActions)
	}
	if p.spec.FailurePolicy == nil || *p.spec.FailurePolicy != admissionv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", p.spec.FailurePolicy)
	}
	rules := p.spec.MatchConstraints.ResourceRules
	if len(rules) != 1 {
		t.Fatalf("want one resource rule, got %d", len(rules))
	}
	r := rules[0]
	ops := fmt.Sprint(r.Operations)
	if fmt.Sprint(r.APIGroups) != "[resource.k8s.io]" || fmt.Sprint(r.Resources) != "[resourceslices]" ||
		fmt.Sprint(r.APIVersions) != "[*]" || ops != "[CREATE UPDATE DELETE]" {
		t.Errorf("the policy matches %v %v %v %v", r.APIGroups, r.APIVersions, r.Resources, r.Operations)
	}
}

// pod is a pod bound to node, with annotations and labels.
func pod(node string, annotations, labels map[string]any) map[string]any {
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": "app", "namespace": "default", "annotations": annotations, "labels": labels},
		"spec":       map[string]any{"nodeName": node, "containers": []any{map[string]any{"name": "app", "image": "i"}}},
	}
}

// The pods policy (retryWaitingPods): the agent may set its one annotation on a pod of its own
// node, and nothing else; other users are not its concern.
func TestThePodsPolicyLetsTheAgentChangeOnlyItsAnnotationOfItsNodesPods(t *testing.T) {
	p := compileNamedPolicy(t, readFile(t, filepath.Join(repoRoot(t), "deploy", "manifests", "resmgr.yaml")), podsPolicy)
	user := agentUser(t)
	mark := ourDriver + "/prepare-retry"
	before := pod("node-a", map[string]any{"team": "a"}, map[string]any{"app": "x"})
	marked := pod("node-a", map[string]any{"team": "a", mark: "1733470000"}, map[string]any{"app": "x"})
	if d := p.evaluate(t, admissionRequest("UPDATE", user, "node-a"), marked, before); !d.matched || len(d.denials) != 0 {
		t.Fatalf("marking a pod of its node: matched %v, denied %v", d.matched, d.denials)
	}
	remarked := pod("node-a", map[string]any{"team": "a", mark: "1733470099"}, map[string]any{"app": "x"})
	if d := p.evaluate(t, admissionRequest("UPDATE", user, "node-a"), remarked, marked); len(d.denials) != 0 {
		t.Fatalf("marking it again: denied %v", d.denials)
	}
	denied := func(what string, request, object, old map[string]any, message string) {
		t.Helper()
		d := p.evaluate(t, request, object, old)
		if !d.matched || !strings.Contains(strings.Join(d.denials, "; "), message) {
			t.Errorf("%s: matched %v, denied %v; want %q", what, d.matched, d.denials, message)
		}
	}
	req := admissionRequest("UPDATE", user, "node-a")
	denied("a label", req, pod("node-a", map[string]any{"team": "a"}, map[string]any{"app": "y"}), before,
		"may change only the annotation "+mark)
	denied("another annotation", req, pod("node-a", map[string]any{"team": "b", mark: "1"}, map[string]any{"app": "x"}), before,
		"may change only the annotation "+mark)
	denied("an annotation removed", req, pod("node-a", map[string]any{mark: "1"}, map[string]any{"app": "x"}), before,
		"may change only the annotation "+mark)
	respec := pod("node-a", map[string]any{"team": "a"}, map[string]any{"app": "x"})
	respec["spec"].(map[string]any)["activeDeadlineSeconds"] = 5
	denied("the spec", req, respec, before, "may change only the annotation "+mark)
	denied("a pod of another node", req, pod("node-b", map[string]any{mark: "1"}, nil), pod("node-b", nil, nil),
		"may mark only pods on its own node")
	denied("a token without a node", admissionRequest("UPDATE", user, ""), marked, before,
		"may mark only pods on its own node")
	denied("creating a pod", admissionRequest("CREATE", user, "node-a"), marked, nil,
		"may only mark pods")
	denied("deleting a pod", admissionRequest("DELETE", user, "node-a"), nil, before,
		"may only mark pods")
	status := admissionRequest("UPDATE", user, "node-a")
	status["subResource"] = "status"
	denied("a subresource", status, marked, before, "may only mark pods")
	if d := p.evaluate(t, admissionRequest("UPDATE", "system:node:node-a", "node-a"), respec, before); d.matched {
		t.Errorf("the policy applied to the kubelet")
	}
}
