package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// WaitLimit bounds every wait for the control plane or the agent to react.
const WaitLimit = 60 * time.Second

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// Namespace creates a namespace and waits for the service account controller to make its
// `default` ServiceAccount, which the ServiceAccount admission plugin needs before it admits a
// pod there.
func (c *Cluster) Namespace(name string) {
	c.t.Helper()
	cx, cancel := ctx()
	_, err := c.Admin.CoreV1().Namespaces().Create(cx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	cancel()
	if err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatalf("creating namespace %s: %v", name, err)
	}
	c.Poll("the default ServiceAccount of namespace "+name, func(cx context.Context) (bool, error) {
		_, err := c.Admin.CoreV1().ServiceAccounts(name).Get(cx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// Not made yet: the controller makes it when it sees the namespace.
			return false, nil
		}
		return err == nil, err
	})
}

// Node registers a Node as the kubelet would, with allocatable cpu, memory and pods, marks it
// Ready through the status subresource, and removes the not-ready taint that the API server's
// TaintNodesByCondition admission put on it. That is the node lifecycle controller's job, which
// does not run here: it would take a node without a kubelet's heartbeats for unreachable.
func (c *Cluster) Node(name string, cpu, memory string) *corev1.Node {
	c.t.Helper()
	cx, cancel := ctx()
	defer cancel()
	nodes := c.Admin.CoreV1().Nodes()
	node, err := nodes.Create(cx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}}},
		metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating node %s: %v", name, err)
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(cpu),
		corev1.ResourceMemory: resource.MustParse(memory),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	now := metav1.Now()
	node.Status = corev1.NodeStatus{
		Capacity: resources, Allocatable: resources,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
	}
	if node, err = nodes.UpdateStatus(cx, node, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("marking node %s ready: %v", name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(cx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = nil
		node, err = nodes.Update(cx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		c.t.Fatalf("removing the taints of node %s: %v", name, err)
	}
	return node
}

// Scheduled waits until the scheduler has bound the pod to a node and returns it.
func (c *Cluster) Scheduled(namespace, name string) *corev1.Pod {
	c.t.Helper()
	var pod *corev1.Pod
	err := c.poll(func(cx context.Context) (bool, error) {
		p, err := c.Admin.CoreV1().Pods(namespace).Get(cx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Spec.NodeName != "", nil
	})
	if err != nil {
		c.t.Fatalf("pod %s/%s was not scheduled: %v\nits conditions: %s\nkube-scheduler's log ends:\n%s",
			namespace, name, err, conditions(pod), c.SchedulerLog())
	}
	return pod
}

// Unschedulable waits until the scheduler has tried the pod and found no node for it, and
// returns the scheduler's message.
func (c *Cluster) Unschedulable(namespace, name string) string {
	c.t.Helper()
	var pod *corev1.Pod
	var message string
	err := c.poll(func(cx context.Context) (bool, error) {
		p, err := c.Admin.CoreV1().Pods(namespace).Get(cx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("the scheduler bound it to %s", p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				message = cond.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		c.t.Fatalf("pod %s/%s: want it unschedulable: %v\nits conditions: %s", namespace, name, err, conditions(pod))
	}
	c.t.Logf("scheduler: pod %s/%s unschedulable: %s", namespace, name, message)
	return message
}

// Claim reads a ResourceClaim.
func (c *Cluster) Claim(namespace, name string) *resourcev1.ResourceClaim {
	c.t.Helper()
	cx, cancel := ctx()
	defer cancel()
	claim, err := c.Admin.ResourceV1().ResourceClaims(namespace).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatalf("reading claim %s/%s: %v", namespace, name, err)
	}
	return claim
}

// DeletePod removes a pod at once (the kubelet would confirm its containers are gone) and waits
// for the resource claim controller to release its claims: the pod leaves each claim's
// reservedFor, and a claim no one reserves any more is deallocated.
func (c *Cluster) DeletePod(pod *corev1.Pod) {
	c.t.Helper()
	cx, cancel := ctx()
	zero := int64(0)
	err := c.Admin.CoreV1().Pods(pod.Namespace).Delete(cx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	cancel()
	if err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatalf("deleting pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	for _, name := range podClaimNames(pod) {
		c.Poll("the resource claim controller to release claim "+pod.Namespace+"/"+name+" of pod "+pod.Name,
			func(cx context.Context) (bool, error) {
				claim, err := c.Admin.ResourceV1().ResourceClaims(pod.Namespace).Get(cx, name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return true, nil
				}
				if err != nil {
					return false, err
				}
				for _, r := range claim.Status.ReservedFor {
					if r.UID == pod.UID {
						return false, nil
					}
				}
				return len(claim.Status.ReservedFor) > 0 || claim.Status.Allocation == nil, nil
			})
	}
}

// podClaimNames are the names of a pod's ResourceClaims: those it names, and those the resource
// claim controller made for it from templates.
func podClaimNames(pod *corev1.Pod) []string {
	var names []string
	for _, ref := range pod.Spec.ResourceClaims {
		if ref.ResourceClaimName != nil {
			names = append(names, *ref.ResourceClaimName)
		}
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			names = append(names, *s.ResourceClaimName)
		}
	}
	return names
}

// poll runs cond every 100 ms until it is true or fails, or WaitLimit passes; a timeout names
// the last error cond returned. Each call of cond gets a context of its own.
func (c *Cluster) poll(cond func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(WaitLimit)
	var last error
	for {
		c.Alive()
		cx, cancel := ctx()
		done, err := cond(cx)
		cancel()
		if done || err != nil && !transient(err) {
			return err
		}
		last = err
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("not within %s (last error: %w)", WaitLimit, last)
			}
			return fmt.Errorf("not within %s", WaitLimit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// transient is an error a poll retries: the API server restarting, a timeout.
func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || strings.Contains(err.Error(), "connection refused")
}

// Poll is poll for tests: it fails the test with what when cond does not hold in time.
func (c *Cluster) Poll(what string, cond func(context.Context) (bool, error)) {
	c.t.Helper()
	if err := c.poll(cond); err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func conditions(pod *corev1.Pod) string {
	if pod == nil {
		return "(no pod)"
	}
	var parts []string
	for _, c := range pod.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}
