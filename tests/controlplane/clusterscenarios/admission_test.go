package clusterscenarios

import (
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// agentAccount is the chart's ServiceAccount of the agent.
const agentAccount = "resmgr"

// otherNode names a node that is not the agent's.
const otherNode = "worker-b"

func slice(name, nodeName, driverName string, allNodes bool) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{Driver: driverName,
			Pool:    resourcev1.ResourcePool{Name: "pool-" + name, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "dev0"}}},
	}
	if allNodes {
		all := true
		s.Spec.AllNodes = &all
	} else {
		s.Spec.NodeName = &nodeName
	}
	return s
}

// tokenClient is a client of the agent's ServiceAccount with a token made by `kubectl create
// token` with args (bound to a pod, or not).
func tokenClient(t *testing.T, args ...string) kubernetes.Interface {
	t.Helper()
	token, err := node.Kubectl(append([]string{"create", "token", agentAccount, "-n", onenode.Namespace, "--duration", "1h"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(node.RESTConfig)
	cfg.BearerToken = strings.TrimSpace(token)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// The agent's identity is what our chart and admission policy say, enforced by the real API
// server: its token, which the kubelet projects into its pod bound to the pod, lets it write its
// own node's slices of its own driver (it publishes), and the policy refuses it another node's
// slice, another driver's, a slice for all nodes, taking over or deleting another node's slice,
// and any slice write with a token that is not bound to a pod (no node name). RBAC refuses what
// the ClusterRole does not grant. A token made like the kubelet's (`kubectl create token`, bound
// to the agent's pod) stands in for the agent's own, which stays in its container.
func TestTheAgentMayWriteOnlyItsOwnNodesSlices(t *testing.T) {
	published := nodeSlices(t)
	if len(published) == 0 {
		t.Fatal("the agent has published no slices")
	}
	for _, s := range published {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != onenode.NodeName || s.Spec.Driver != driver {
			t.Fatalf("the agent published %+v", s.Spec)
		}
	}

	agent := tokenClient(t, "--bound-object-kind", "Pod", "--bound-object-name", agentPod(t).Name)
	unbound := tokenClient(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(client kubernetes.Interface, s *resourcev1.ResourceSlice) error {
		c, cancel := cx()
		defer cancel()
		_, err := client.ResourceV1().ResourceSlices().Create(c, s, dryRun)
		return err
	}
	denied := func(what string, err error, message string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: allowed, want the admission policy to deny it", what)
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), message) {
			t.Fatalf("%s: refused with %v, want the policy's %q", what, err, message)
		}
	}
	other := slice("other-node", otherNode, driver, false)
	denied("a slice of another node", create(agent, other),
		"the resmgr agent on node "+onenode.NodeName+" may not write ResourceSlices of node "+otherNode)
	denied("a slice of another driver", create(agent, slice("other-driver", onenode.NodeName, "gpu.example.com", false)),
		"may write only ResourceSlices of driver "+driver+", not gpu.example.com")
	denied("a slice for all nodes", create(agent, slice("all-nodes", "", driver, true)),
		"may not write ResourceSlices of no single node")
	denied("its own node's slice with a token not bound to a pod", create(unbound, slice("unbound", onenode.NodeName, driver, false)),
		"the request carries no node name")
	if err := create(agent, slice("own", onenode.NodeName, driver, false)); err != nil {
		t.Fatalf("a slice of its own node and driver: %v", err)
	}

	// Someone else's slice of another node (the admin, whom the policy does not match) can be
	// neither updated nor deleted by the agent.
	c, cancel := cx()
	defer cancel()
	theirs, err := node.Client.ResourceV1().ResourceSlices().Create(c, other, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the admin creating another node's slice: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := cx()
		defer cancel()
		if err := node.Client.ResourceV1().ResourceSlices().Delete(c, theirs.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting the slice of node %s: %v", otherNode, err)
		}
	})
	theirs.Labels = map[string]string{"taken": "over"}
	_, err = agent.ResourceV1().ResourceSlices().Update(c, theirs, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	denied("updating another node's slice", err, "may not write ResourceSlices of node "+otherNode)
	err = agent.ResourceV1().ResourceSlices().Delete(c, theirs.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	denied("deleting another node's slice", err, "may not write ResourceSlices of node "+otherNode)

	// RBAC: claims can be read and listed (a claim taken back from its CDI spec is known only by
	// its UID), never written; nothing outside the ClusterRole.
	if _, err := agent.ResourceV1().ResourceClaims("").List(c, metav1.ListOptions{}); err != nil {
		t.Fatalf("the agent listing claims of every namespace: %v", err)
	}
	if err := agent.ResourceV1().ResourceClaims("default").Delete(c, "any", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Fatalf("the agent deleting a claim: %v, want forbidden", err)
	}
	if _, err := agent.CoreV1().Secrets("default").List(c, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the agent listing secrets: %v, want forbidden", err)
	}
}

// Once it serves, the agent marks its node's pods that wait for their claims (retryWaitingPods):
// it may list pods and set its one annotation on a pod of its own node, and the second admission
// policy refuses it any other change (a label, another annotation, the spec) and a pod of another
// node; RBAC refuses creating or deleting pods.
func TestTheAgentMayMarkOnlyItsOwnNodesPods(t *testing.T) {
	ns := namespace(t)
	create(t, ns, podSpec{name: "here"})
	running(t, ns, "here")
	elsewhere := podSpec{name: "elsewhere"}.pod(ns)
	elsewhere.Spec.NodeName = otherNode // no such node: it stays Pending, bound there
	c, cancel := cx()
	defer cancel()
	if _, err := node.Client.CoreV1().Pods(ns).Create(c, elsewhere, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No kubelet ends it: without a forced deletion it would stay Terminating until the pod
	// garbage collector takes it, some 40 s after the namespace's cleanup deletes it.
	t.Cleanup(func() {
		c, cancel := cx()
		defer cancel()
		now := int64(0)
		if err := node.Client.CoreV1().Pods(ns).Delete(c, elsewhere.Name, metav1.DeleteOptions{GracePeriodSeconds: &now}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("force-deleting pod %s: %v", elsewhere.Name, err)
		}
	})
	agent := tokenClient(t, "--bound-object-kind", "Pod", "--bound-object-name", agentPod(t).Name)
	mark := driver + "/prepare-retry"
	patch := func(name, body string) error {
		c, cancel := cx()
		defer cancel()
		_, err := agent.CoreV1().Pods(ns).Patch(c, name, types.MergePatchType, []byte(body),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if _, err := agent.CoreV1().Pods("").List(c, metav1.ListOptions{FieldSelector: "spec.nodeName=" + onenode.NodeName}); err != nil {
		t.Fatalf("the agent listing its node's pods: %v", err)
	}
	if err := patch("here", `{"metadata":{"annotations":{"`+mark+`":"1"}}}`); err != nil {
		t.Fatalf("the agent marking a pod of its node: %v", err)
	}
	for what, body := range map[string]string{
		"a label":            `{"metadata":{"labels":{"taken":"over"}}}`,
		"another annotation": `{"metadata":{"annotations":{"` + mark + `":"1","other":"x"}}}`,
		"the spec":           `{"spec":{"activeDeadlineSeconds":5}}`,
	} {
		err := patch("here", body)
		if err == nil || !strings.Contains(err.Error(), "may change only the annotation "+mark) {
			t.Fatalf("the agent changing %s of a pod: %v, want the policy to refuse it", what, err)
		}
	}
	err := patch("elsewhere", `{"metadata":{"annotations":{"`+mark+`":"1"}}}`)
	if err == nil || !strings.Contains(err.Error(), "may mark only pods on its own node") {
		t.Fatalf("the agent marking a pod of node %s: %v, want the policy to refuse it", otherNode, err)
	}
	if err := agent.CoreV1().Pods(ns).Delete(c, "here", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Fatalf("the agent deleting a pod: %v, want forbidden", err)
	}
}
