package agent

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthapi "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// `resmgr run` serves the resource health stream in the version a 1.37 kubelet opens (v1) and
// in the one a 1.36 kubelet opens on every DRA plugin (v1alpha1, read here through the 1.37
// kubelet's wrapper), with its published devices, each Healthy (the synthetic topology's CPUs
// count as online), in the node's pool, with a fresh check time and a timeout the kubelet
// honours.
func TestTheAgentReportsDeviceHealth(t *testing.T) {
	c := start(t)
	endpoint := c.ready()
	conn, err := grpc.NewClient("unix:"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dialing the DRA socket: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	v1, err := healthapi.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &healthapi.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatalf("NodeWatchResources (v1): %v", err)
	}
	v1alpha1, err := healthapi.V1Alpha1ClientWrapper{Client: healthv1alpha1.NewDRAResourceHealthClient(conn)}.
		NodeWatchResources(ctx, &healthapi.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatalf("NodeWatchResources (v1alpha1): %v", err)
	}
	expectHealthyDevices(t, "v1", v1)
	expectHealthyDevices(t, "v1alpha1", v1alpha1)
}

func expectHealthyDevices(t *testing.T, version string, stream healthapi.DRAResourceHealth_NodeWatchResourcesClient) {
	t.Helper()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("receiving the first health report (%s): %v", version, err)
	}
	var devices []string
	for _, d := range resp.GetDevices() {
		if d.GetDevice().GetPoolName() != node || d.GetHealth() != healthapi.HealthStatus_HEALTHY || d.GetMessage() != "" {
			t.Fatalf("device health %v, want %s healthy", d, node)
		}
		if age := time.Since(time.Unix(d.GetLastUpdatedTime(), 0)); age < -time.Second || age > waitLimit {
			t.Fatalf("device %v checked %v ago", d.GetDevice(), age)
		}
		if d.GetHealthCheckTimeoutSeconds() < 30 {
			t.Fatalf("device %v: timeout %d s, shorter than the kubelet's default", d.GetDevice(), d.GetHealthCheckTimeoutSeconds())
		}
		devices = append(devices, d.GetDevice().GetDeviceName())
	}
	sort.Strings(devices)
	if got := strings.Join(devices, ","); got != "numa0,numa1" {
		t.Fatalf("%s: health reported for devices %q, want the published numa0,numa1", version, got)
	}
}
