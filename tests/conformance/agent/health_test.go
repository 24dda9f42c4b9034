package agent

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthapi "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// `resmgr run` serves the resource health stream a 1.36 kubelet opens on every DRA plugin, with
// its published devices, each Healthy (the synthetic topology's CPUs count as online), in the
// node's pool, with a fresh check time and a timeout the kubelet honours.
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
	stream, err := healthapi.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &healthapi.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatalf("NodeWatchResources: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("receiving the first health report: %v", err)
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
		t.Fatalf("health reported for devices %q, want the published numa0,numa1", got)
	}
}
