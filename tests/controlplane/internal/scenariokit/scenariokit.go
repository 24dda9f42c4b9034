// Package scenariokit holds the test helpers that the packages whose tests share one onenode
// cluster (clusterscenarios, nodev2scenarios) have in common: an API call's context, the waits,
// a test's namespace, deleting a pod, a container's runtime ID, a pod's generated claim and
// parsing a cpuset. The helpers that differ between the packages stay in their helpers_test.go.
package scenariokit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
	"github.com/resmgr/resmgr/tests/gokit/cpulist"
)

// Kit is the helpers on one package's node, with that package's waits: a VM node is several
// times slower than this machine, so its package waits longer and looks less often.
type Kit struct {
	Node *onenode.Node
	// Limit bounds each wait of the helpers for the cluster to react.
	Limit time.Duration
	// Every is how long Poll sleeps between two calls of its condition.
	Every time.Duration
	// Note, when set, is what Poll's failure adds to its message (the end of the kubelet's log).
	Note func() string
	// DeleteNamespaces makes Namespace delete a test's namespace too, once its pods are gone.
	DeleteNamespaces bool
}

// Cx is the context of one API call.
func Cx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// Poll calls cond every k.Every until it is true or within passes, then fails with its last
// error.
func (k Kit) Poll(t testing.TB, what string, within time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			note := ""
			if k.Note != nil {
				note = k.Note()
			}
			t.Fatalf("%s: not after %s (last: %v)%s", what, within, last, note)
		}
		time.Sleep(k.Every)
	}
}

// Namespace creates the namespace name for one test: the test's end deletes its pods and waits
// until they are gone (stopped, their claims unprepared), so that no test's pods are still
// stopping while the next one runs. (Whatever a test's pods are doing when it ends would
// otherwise meet the next test's claims: on CRI-O 1.36 the agent's moving a stopping container
// is where its NRI can deadlock, TestAClaimReleasedWhileTheContainersItMovesBackStop.) With
// k.DeleteNamespaces the namespace itself goes after them; waiting for it would cost the
// namespace controller's seconds.
func (k Kit) Namespace(t testing.TB, name string) string {
	t.Helper()
	namespaces := k.Node.Client.CoreV1().Namespaces()
	create := func() error {
		c, cancel := Cx()
		defer cancel()
		_, err := namespaces.Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		return err
	}
	if err := create(); apierrors.IsAlreadyExists(err) {
		// An earlier run of the same test made it (`cargo xtask e2e --count N`); its end waited
		// for its pods, and its namespace is kept or still being deleted.
		k.Poll(t, "namespace "+name+" of the test's earlier run to be gone", k.Limit, func() (bool, error) {
			c, cancel := Cx()
			ns, err := namespaces.Get(c, name, metav1.GetOptions{})
			cancel()
			switch {
			case apierrors.IsNotFound(err):
				err := create()
				return err == nil, err
			case err != nil:
				return false, err
			default:
				return ns.DeletionTimestamp == nil && !k.DeleteNamespaces, fmt.Errorf("namespace %s is %s", name, ns.Status.Phase)
			}
		})
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The pods first, by us: the namespace controller would start on them seconds later.
		c, cancel := Cx()
		err := k.Node.Client.CoreV1().Pods(name).DeleteCollection(c, metav1.DeleteOptions{}, metav1.ListOptions{})
		cancel()
		if err != nil {
			t.Errorf("deleting the pods of namespace %s: %v", name, err)
		}
		k.Poll(t, "the pods of namespace "+name+" to be gone", k.Limit, func() (bool, error) {
			c, cancel := Cx()
			defer cancel()
			pods, err := k.Node.Client.CoreV1().Pods(name).List(c, metav1.ListOptions{})
			return err == nil && len(pods.Items) == 0, err
		})
		if !k.DeleteNamespaces {
			return
		}
		c, cancel = Cx()
		defer cancel()
		if err := k.Node.Client.CoreV1().Namespaces().Delete(c, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", name, err)
		}
	})
	// The controller-manager's serviceaccount controller makes the default ServiceAccount,
	// without which pods are refused.
	k.Poll(t, "the default ServiceAccount of "+name, k.Limit, func() (bool, error) {
		c, cancel := Cx()
		defer cancel()
		_, err := k.Node.Client.CoreV1().ServiceAccounts(name).Get(c, "default", metav1.GetOptions{})
		return err == nil, err
	})
	return name
}

// DeletePod deletes a pod and waits until it is gone.
func (k Kit) DeletePod(t testing.TB, ns, name string) {
	t.Helper()
	c, cancel := Cx()
	defer cancel()
	if err := k.Node.Client.CoreV1().Pods(ns).Delete(c, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.Poll(t, "pod "+ns+"/"+name+" to be gone", k.Limit, func() (bool, error) {
		c, cancel := Cx()
		defer cancel()
		_, err := k.Node.Client.CoreV1().Pods(ns).Get(c, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

// ContainerID is the runtime's ID of a pod's container.
func ContainerID(t testing.TB, pod *corev1.Pod, container string) string {
	t.Helper()
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			_, id, ok := strings.Cut(s.ContainerID, "://")
			if !ok {
				t.Fatalf("container %s of %s has ID %q", container, pod.Name, s.ContainerID)
			}
			return id
		}
	}
	t.Fatalf("pod %s has no container %s", pod.Name, container)
	return ""
}

// PodClaim is the ResourceClaim the controller made for a pod's claim "cpus", or for its only
// claim (the examples name theirs as they like).
func (k Kit) PodClaim(t testing.TB, pod *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	name := ""
	statuses := pod.Status.ResourceClaimStatuses
	for _, s := range statuses {
		if s.ResourceClaimName != nil && (s.Name == "cpus" || len(statuses) == 1) {
			name = *s.ResourceClaimName
		}
	}
	if name == "" {
		t.Fatalf("pod %s has no generated claim: %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	}
	c, cancel := Cx()
	defer cancel()
	claim, err := k.Node.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(c, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

// CPUs reads a cpuset ("1,3-5") the kernel or the agent wrote; a malformed one fails the test.
func CPUs(t testing.TB, set string) cpulist.Set {
	t.Helper()
	cpus, err := cpulist.Parse(set)
	if err != nil {
		t.Fatal(err)
	}
	return cpus
}
