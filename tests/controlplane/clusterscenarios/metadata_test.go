package clusterscenarios

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// Device metadata (KEP-5304) in a real pod: a container with a claim from a template reads its
// claim's metadata at the path the protocol gives it (the pod's name for the claim,
// `resourceclaimtemplates/cpus/cpus/<driver>-metadata.json`), which the agent wrote and the
// runtime mounted read-only through the claim's CDI spec, and finds in it exactly the CPUs the
// kernel lets it run on (its Cpus_allowed_list). The test decodes what the container printed
// with the reader of k8s.io/dynamic-resource-allocation at the control plane's release of this
// module (1.36: it knows v1alpha1 only, and skips the v1beta1 object the file starts with).
func TestAPodReadsItsClaimsCPUsInItsDeviceMetadata(t *testing.T) {
	ns := namespace(t)
	claimTemplate(t, ns, "one-cpu", 1)
	path := metadata.ResourceClaimTemplateFilePath(driver, "cpus", "cpus")
	pod := podSpec{name: "reader", template: "one-cpu"}.pod(ns)
	pod.Spec.Containers[0].Command = []string{"/bin/sh", "-c",
		"cat " + path + "; echo '---'; grep Cpus_allowed_list /proc/self/status; " +
			// The shell reports a failed redirection on its stderr before a 2>/dev/null after it
			// applies: the group's own redirection keeps it out of the log, where it could land
			// ahead of the file's text (the runtime reads stdout and stderr apart).
			"if { echo x >> " + path + "; } 2>/dev/null; then echo writable; else echo read-only; fi; " +
			"trap 'exit 0' TERM; sleep 2147483647 & wait"}
	c, cancel := cx()
	defer cancel()
	if _, err := node.Client.CoreV1().Pods(ns).Create(c, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reader := running(t, ns, "reader")
	claim := podClaim(t, reader)
	p := placement(t, reader, "app")
	granted := grantedCPUs(t, p, claim)

	var out string
	poll(t, "the container to print its metadata", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		raw, err := node.Client.CoreV1().Pods(ns).GetLogs("reader", &corev1.PodLogOptions{Container: "app"}).Do(c).Raw()
		out = string(raw)
		return strings.Contains(out, "read-only") || strings.Contains(out, "writable"), err
	})
	file, rest, ok := strings.Cut(out, "---\n")
	if !ok {
		t.Fatalf("the container printed no metadata:\n%s", out)
	}
	var dm metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader([]byte(file))), &dm); err != nil {
		t.Fatalf("decoding what the container read at %s: %v\n%s", path, err, file)
	}
	allowed := ""
	for _, line := range strings.Split(rest, "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			allowed = strings.TrimSpace(v)
		}
	}
	if len(dm.Requests) != 1 || len(dm.Requests[0].Devices) != 1 {
		t.Fatalf("the metadata's requests: %+v", dm.Requests)
	}
	device := dm.Requests[0].Devices[0]
	said := "(none)"
	if got := device.Attributes["grantedCpus"].StringValue; got != nil {
		said = *got
	}
	t.Logf("container %s: Cpus_allowed_list %q, cgroup %q, metadata device %s/%s grantedCpus %q", claim.Name, allowed, p.CgroupCPUs, device.Pool, device.Name, said)
	if said != allowed || allowed != granted || allowed != p.CgroupCPUs {
		t.Fatalf("the metadata says cpus %q, the container is allowed %q (cgroup %q, DRA_CPUSET_ %q)", said, allowed, p.CgroupCPUs, granted)
	}
	if dm.Name != claim.Name || string(dm.UID) != string(claim.UID) || dm.PodClaimName == nil || *dm.PodClaimName != "cpus" ||
		dm.Requests[0].Name != "cpus" || device.Driver != driver || device.Name != claim.Status.Allocation.Devices.Results[0].Device {
		t.Fatalf("the metadata names claim %s (%s), pod claim %v, request %s, device %s/%s; the claim is %s (%s) on %s",
			dm.Name, dm.UID, dm.PodClaimName, dm.Requests[0].Name, device.Driver, device.Name,
			claim.Name, claim.UID, claim.Status.Allocation.Devices.Results[0].Device)
	}
	if !strings.Contains(rest, "read-only") {
		t.Fatalf("the container could write to its metadata:\n%s", rest)
	}
}
