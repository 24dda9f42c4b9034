// Device metadata (KEP-5304), read the way a workload reads it: the agent prepares a claim, the
// runtimes' CDI cache injects the claim's device into an OCI spec, and the mount it adds is where
// the kubelet's helper library puts a claim's metadata in the container
// (k8s.io/dynamic-resource-allocation/api/metadata); the file it mounts decodes with that
// library's reader (devicemetadata), into the internal type and into v1alpha1 (what a 1.36-era
// consumer such as KubeVirt 1.9 reads), and says the CPUs the container is granted. A claim made
// from a template is found under the pod's name for it. Unprepare takes the file away.
package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// injectSpec resolves a qualified CDI device with the runtimes' CDI cache into an OCI spec.
func (c *cluster) injectSpec(cdiID string) *oci.Spec {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(c.path("cdi")), cdi.WithAutoRefresh(false))
	if err != nil {
		c.t.Fatalf("CDI cache: %v", err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if _, err := cache.InjectDevices(spec, cdiID); err != nil {
		c.t.Fatalf("injecting %s: %v", cdiID, err)
	}
	return spec
}

// mountAt is the spec's mount at destination dst, which must be there once.
func mountAt(t *testing.T, spec *oci.Spec, dst string) oci.Mount {
	t.Helper()
	var found []oci.Mount
	for _, m := range spec.Mounts {
		if m.Destination == dst {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one mount at %s, the spec has %+v", dst, spec.Mounts)
	}
	return found[0]
}

func envValue(spec *oci.Spec, prefix string) string {
	for _, e := range spec.Process.Env {
		if v, ok := strings.CutPrefix(e, prefix); ok {
			return v
		}
	}
	return ""
}

func prepare(t *testing.T, endpoint string, claims ...*drav1.Claim) map[string]*drav1.NodePrepareResourceResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := draClient(t, endpoint).NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	for _, claim := range claims {
		if got := resp.Claims[claim.Uid]; got == nil || got.Error != "" {
			t.Fatalf("claim %s was answered %+v", claim.Name, got)
		}
	}
	return resp.Claims
}

func TestDeviceMetadataReadsBack(t *testing.T) {
	c := start(t)
	endpoint := c.ready()
	db := &drav1.Claim{Namespace: "default", Name: "db-cpus", Uid: claimUID}
	prepare(t, endpoint, db)

	cdiID := fmt.Sprintf("%s/device=claim-%s-0", driver, claimUID)
	spec := c.injectSpec(cdiID)
	granted := envValue(spec, "DRA_CPUSET_"+claimUID+"=")
	if granted == "" {
		t.Fatalf("the injected environment %v grants no cpus", spec.Process.Env)
	}
	mount := mountAt(t, spec, metadata.ResourceClaimFilePath(driver, "db-cpus", "cpus"))
	if !slices.Contains(mount.Options, "ro") || !slices.Contains(mount.Options, "bind") {
		t.Fatalf("the metadata is mounted %+v, want a read-only bind mount", mount)
	}
	data, err := os.ReadFile(mount.Source)
	if err != nil {
		t.Fatalf("the mount's source: %v", err)
	}

	// What a current consumer reads: the internal type, from the first version it knows.
	var dm metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &dm); err != nil {
		t.Fatalf("decoding %s: %v\n%s", mount.Source, err, data)
	}
	if dm.Name != "db-cpus" || dm.Namespace != "default" || string(dm.UID) != claimUID || dm.Generation != 1 || dm.PodClaimName != nil {
		t.Fatalf("the metadata names %s/%s (%s) generation %d pod claim %v", dm.Namespace, dm.Name, dm.UID, dm.Generation, dm.PodClaimName)
	}
	if len(dm.Requests) != 1 || dm.Requests[0].Name != "cpus" || len(dm.Requests[0].Devices) != 1 {
		t.Fatalf("the metadata's requests: %+v", dm.Requests)
	}
	device := dm.Requests[0].Devices[0]
	if device.Driver != driver || device.Pool != node || device.Name != "numa1" {
		t.Fatalf("the metadata's device is %s/%s/%s", device.Driver, device.Pool, device.Name)
	}
	if got := device.Attributes["grantedCpus"].StringValue; got == nil || *got != granted {
		t.Fatalf("grantedCpus is %v, the container is granted %s", got, granted)
	}
	var ids []string
	for _, id := range device.Attributes["grantedCpuIDs"].IntValues {
		ids = append(ids, fmt.Sprint(id))
	}
	if want := expand(granted); strings.Join(ids, ",") != want {
		t.Fatalf("grantedCpuIDs is %v, want %s", ids, want)
	}
	if node := device.Attributes["resource.kubernetes.io/numaNode"].IntValue; node == nil || *node != 1 {
		t.Fatalf("numaNode is %v, want 1", node)
	}
	if mems := device.Attributes["grantedMemoryNodes"].StringValue; mems == nil || *mems != "1" {
		t.Fatalf("grantedMemoryNodes is %v, want 1", mems)
	}

	// What a consumer that knows only v1alpha1 reads (Kubernetes 1.36's types).
	var old metav1alpha1.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &old); err != nil {
		t.Fatalf("decoding %s as v1alpha1: %v", mount.Source, err)
	}
	if old.APIVersion != "metadata.resource.k8s.io/v1alpha1" || old.Requests[0].Devices[0].Name != "numa1" {
		t.Fatalf("v1alpha1 reads %s with devices %+v", old.APIVersion, old.Requests)
	}

	// Prepared again (the kubelet's retry, a reboot's re-prepare), the file is the same one.
	prepare(t, endpoint, db)
	again, err := os.ReadFile(mount.Source)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("a second prepare changed the metadata (%v):\n%s", err, again)
	}

	// Unprepare: the file goes with the spec.
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	un, err := draClient(t, endpoint).NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: []*drav1.Claim{db}})
	if err != nil || un.Claims[claimUID].GetError() != "" {
		t.Fatalf("NodeUnprepareResources: %+v %v", un, err)
	}
	if exists(mount.Source)() {
		t.Fatalf("%s outlived the claim", mount.Source)
	}
}

func TestDeviceMetadataOfTemplateClaims(t *testing.T) {
	c := start(t)
	endpoint := c.ready()
	prepare(t, endpoint, &drav1.Claim{Namespace: "default", Name: "cache-cpus-x7k2p", Uid: templateUID})
	spec := c.injectSpec(fmt.Sprintf("%s/device=claim-%s-0", driver, templateUID))
	mount := mountAt(t, spec, metadata.ResourceClaimTemplateFilePath(driver, "cpus", "cpus"))
	f, err := os.Open(mount.Source)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dm metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(f), &dm); err != nil {
		t.Fatalf("decoding %s: %v", mount.Source, err)
	}
	if dm.PodClaimName == nil || *dm.PodClaimName != "cpus" || dm.Name != "cache-cpus-x7k2p" {
		t.Fatalf("the metadata says claim %s, pod claim %v", dm.Name, dm.PodClaimName)
	}
	granted := envValue(spec, "DRA_CPUSET_"+templateUID+"=")
	if got := dm.Requests[0].Devices[0].Attributes["grantedCpus"].StringValue; got == nil || *got != granted {
		t.Fatalf("grantedCpus is %v, the container is granted %s", got, granted)
	}
}

// expand lists a kernel cpu list's CPUs, comma-separated ("2-3" -> "2,3").
func expand(list string) string {
	var out []string
	for cpu := 0; cpu < 1024; cpu++ {
		if cpus(list)[cpu] {
			out = append(out, fmt.Sprint(cpu))
		}
	}
	return strings.Join(out, ",")
}
