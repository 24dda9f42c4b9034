package clusterscenarios

import (
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// helm upgrade with a changed value rolls the agent (the config checksum changes) with the new
// setting in its ConfigMap, and a claim pod keeps its CPUs across it (docs/deploy.md,
// "Upgrading"); helm uninstall, once no claim is prepared, removes the agent and its objects, the
// kubelet removes the driver's ResourceSlices after the agent stops, and a running container
// keeps the cpuset it had (docs/deploy.md, "Uninstalling without losing claims"). The chart is
// installed again at the end, for the tests after this one.
func TestHelmUpgradeRollsTheAgentAndUninstallRemovesItAsTheDocsSay(t *testing.T) {
	ns := namespace(t)
	pod, granted := pinnedPod(t, ns, "pinned")
	before := agentPod(t)
	values, err := node.ValuesFile("values-upgrade.json", map[string]any{"config": map[string]any{"log-level": "info,resmgr=debug"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Kubectl("-n", onenode.Namespace, "rollout", "status", "daemonset/"+onenode.Release, "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	after := agentPod(t)
	if after.UID == before.UID {
		t.Fatalf("helm upgrade with a changed setting left the agent's pod %s as it was", before.Name)
	}
	config, err := node.Kubectl("-n", onenode.Namespace, "get", "configmap", onenode.Release, "-o", "jsonpath={.data}")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(config, "resmgr=debug") {
		t.Fatalf("the upgraded ConfigMap lacks the new log level: %s", config)
	}
	keeps(t, pod, granted)

	shared := podSpec{name: "stays"}
	create(t, ns, shared)
	stays := running(t, ns, "stays")
	deletePod(t, ns, "pinned")
	kept := placement(t, stays, "app").CgroupCPUs
	if _, err := node.Helm("uninstall", onenode.Release, "-n", onenode.Namespace, "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	c, cancel := cx()
	_, err = node.Client.AppsV1().DaemonSets(onenode.Namespace).Get(c, onenode.Release, metav1.GetOptions{})
	cancel()
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the DaemonSet is still there after helm uninstall (%v)", err)
	}
	c, cancel = cx()
	_, err = node.Client.ResourceV1().DeviceClasses().Get(c, deviceClass, metav1.GetOptions{})
	cancel()
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the DeviceClass is still there after helm uninstall (%v)", err)
	}
	poll(t, "the kubelet to remove the driver's slices", 2*time.Minute, func() (bool, error) {
		return len(sliceUIDs(t)) == 0, nil
	})
	t.Logf("the kubelet removed the slices %s after helm uninstall", time.Since(began).Round(time.Second))
	if now := placement(t, stays, "app").CgroupCPUs; now != kept {
		t.Fatalf("a running container moved from %q to %q when the agent was uninstalled", kept, now)
	}

	if err := node.InstallAgent(nil); err != nil {
		t.Fatal(err)
	}
	_, again := pinnedPod(t, ns, "again")
	t.Logf("after installing again, a claim got %q", again)
}
