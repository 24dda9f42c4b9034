package scenarios

import (
	"context"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

func slice(name, nodeName, driver string, allNodes bool) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{Driver: driver,
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

// The agent's identity is what our chart and admission policy say, enforced by a real API
// server: its pod-bound token lets it write its own node's slices of its own driver (it
// publishes), and the policy refuses it another node's slice, another driver's, a slice for
// all nodes, taking over or deleting another node's slice, and any slice write with a token
// that is not bound to a pod (no node name). RBAC refuses what the ClusterRole does not grant.
func TestTheAgentMayWriteOnlyItsOwnNodesSlices(t *testing.T) {
	e := start(t, options{})

	// The agent published with its token: the policy let it write its own node's slices.
	for _, s := range e.slices(func(s []resourcev1.ResourceSlice) bool { return len(s) > 0 }) {
		if *s.Spec.NodeName != nodeName || s.Spec.Driver != node.Driver {
			t.Fatalf("the agent published %+v", s.Spec)
		}
	}

	agent, err := kubernetes.NewForConfig(e.cp.TokenConfig(agentToken(e.cp, e.agentPod.Name)))
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := kubernetes.NewForConfig(e.cp.TokenConfig(strings.TrimSpace(
		e.cp.Kubectl("create", "token", agentAccount, "-n", agentNamespace, "--duration", "1h"))))
	if err != nil {
		t.Fatal(err)
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(client kubernetes.Interface, s *resourcev1.ResourceSlice) error {
		cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
		defer cancel()
		_, err := client.ResourceV1().ResourceSlices().Create(cx, s, dryRun)
		return err
	}

	// The API server loads a new policy in the background: wait until it refuses a slice of
	// another node, then check every case.
	other := slice("other-node", "worker-b", node.Driver, false)
	e.cp.Poll("the admission policy to be in force", func(context.Context) (bool, error) {
		err := create(agent, other)
		return err != nil && strings.Contains(err.Error(), "resmgr-own-node-resourceslices"), nil
	})

	denied := func(what string, err error, message string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: allowed, want the admission policy to deny it", what)
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), message) {
			t.Fatalf("%s: refused with %v, want the policy's %q", what, err, message)
		}
	}
	denied("a slice of another node", create(agent, other),
		"the resmgr agent on node "+nodeName+" may not write ResourceSlices of node worker-b")
	denied("a slice of another driver", create(agent, slice("other-driver", nodeName, "gpu.example.com", false)),
		"may write only ResourceSlices of driver "+node.Driver+", not gpu.example.com")
	denied("a slice for all nodes", create(agent, slice("all-nodes", "", node.Driver, true)),
		"may not write ResourceSlices of no single node")
	denied("its own node's slice with a token not bound to a pod", create(unbound, slice("unbound", nodeName, node.Driver, false)),
		"the request carries no node name")
	if err := create(agent, slice("own", nodeName, node.Driver, false)); err != nil {
		t.Fatalf("a slice of its own node and driver: %v", err)
	}

	// Someone else's slice of another node (the admin, whom the policy does not match) can be
	// neither updated nor deleted by the agent.
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	theirs, err := e.cp.Admin.ResourceV1().ResourceSlices().Create(cx, other, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the admin creating another node's slice: %v", err)
	}
	theirs.Labels = map[string]string{"taken": "over"}
	_, err = agent.ResourceV1().ResourceSlices().Update(cx, theirs, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	denied("updating another node's slice", err, "may not write ResourceSlices of node worker-b")
	err = agent.ResourceV1().ResourceSlices().Delete(cx, theirs.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	denied("deleting another node's slice", err, "may not write ResourceSlices of node worker-b")

	// RBAC: claims can be read and listed (a claim taken back from its CDI spec is known only by
	// its UID), never written; nothing outside the ClusterRole.
	if _, err := agent.ResourceV1().ResourceClaims("").List(cx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the agent listing claims of every namespace: %v", err)
	}
	if err := agent.ResourceV1().ResourceClaims(workloads).Delete(cx, "any", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Fatalf("the agent deleting a claim: %v, want forbidden", err)
	}
	if _, err := agent.CoreV1().Pods(workloads).List(cx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the agent listing pods: %v, want forbidden", err)
	}
}
