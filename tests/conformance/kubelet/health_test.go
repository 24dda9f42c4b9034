// The DRA resource health stream as the kubelet opens it (NodeWatchResources), in both of its
// versions, over both ways the kubelet dials, with the generated clients of the kubelet 1.37
// API: v1, which 1.37 opens when a plugin lists it, and v1alpha1, which 1.36 opens (its
// v1alpha1 proto is byte for byte 1.37's), read through the wrapper 1.37 reads it with.
package kubelet

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	healthapi "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// healthVersion is one version of the health service, opened as the kubelet opens it.
type healthVersion struct {
	name string
	// method is the gRPC method path the kubelet calls.
	method string
	open   func(context.Context, *grpc.ClientConn) (healthapi.DRAResourceHealth_NodeWatchResourcesClient, error)
}

var healthVersions = []healthVersion{
	{"v1", "/" + healthapi.DRAResourceHealthService + "/NodeWatchResources",
		func(ctx context.Context, conn *grpc.ClientConn) (healthapi.DRAResourceHealth_NodeWatchResourcesClient, error) {
			return healthapi.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &healthapi.NodeWatchResourcesRequest{})
		}},
	{"v1alpha1", "/" + healthv1alpha1.DRAResourceHealthService + "/NodeWatchResources",
		func(ctx context.Context, conn *grpc.ClientConn) (healthapi.DRAResourceHealth_NodeWatchResourcesClient, error) {
			client := healthv1alpha1.NewDRAResourceHealthClient(conn)
			return healthapi.V1Alpha1ClientWrapper{Client: client}.NodeWatchResources(ctx, &healthapi.NodeWatchResourcesRequest{})
		}},
}

// watchHealth opens a stream with its own context, which cancel ends (the kubelet's way of
// going away).
func watchHealth(t *testing.T, version healthVersion, conn *grpc.ClientConn) (healthapi.DRAResourceHealth_NodeWatchResourcesClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	stream, err := version.open(ctx, conn)
	if err != nil {
		t.Fatalf("NodeWatchResources (%s): %v", version.name, err)
	}
	return stream, cancel
}

// deviceHealth is one device of a message, reduced to what the kubelet reads.
type deviceHealth struct {
	pool, device, message string
	health                healthapi.HealthStatus
}

// nextReport receives one message and checks what every message must carry: a fresh check time
// and a timeout of its own (30 s from the test plugin).
func nextReport(t *testing.T, stream healthapi.DRAResourceHealth_NodeWatchResourcesClient) []deviceHealth {
	t.Helper()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("receiving from the health stream: %v", err)
	}
	var out []deviceHealth
	for _, d := range resp.GetDevices() {
		if age := time.Since(time.Unix(d.GetLastUpdatedTime(), 0)); age < -time.Second || age > waitLimit {
			t.Fatalf("device %v checked %v ago", d.GetDevice(), age)
		}
		if d.GetHealthCheckTimeoutSeconds() != 30 {
			t.Fatalf("device %v: timeout %d s, want 30", d.GetDevice(), d.GetHealthCheckTimeoutSeconds())
		}
		out = append(out, deviceHealth{d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName(), d.GetMessage(), d.GetHealth()})
	}
	return out
}

func expectReport(t *testing.T, got []deviceHealth, want ...deviceHealth) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("health report %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("health report %+v, want %+v", got, want)
		}
	}
}

// A stream starts with the current report and carries each new one; one stream going away
// mid-stream changes nothing for the others or for the next.
func TestHealthStream(t *testing.T) {
	for _, version := range healthVersions {
		for _, style := range dialStyles {
			t.Run(version.name+"/"+style.name, func(t *testing.T) {
				testHealthStream(t, version, style)
			})
		}
	}
}

func testHealthStream(t *testing.T, version healthVersion, style dialStyle) {
	p := startPlugin(t)
	conn := style.dial(t, p.draSocket())
	first, _ := watchHealth(t, version, conn)
	healthy := deviceHealth{"test-pool", "dev-a", "", healthapi.HealthStatus_HEALTHY}
	expectReport(t, nextReport(t, first), healthy)

	p.command("health dev-a=unhealthy:cpus 3 are offline;dev-b=healthy")
	unhealthy := deviceHealth{"test-pool", "dev-a", "cpus 3 are offline", healthapi.HealthStatus_UNHEALTHY}
	healthyB := deviceHealth{"test-pool", "dev-b", "", healthapi.HealthStatus_HEALTHY}
	expectReport(t, nextReport(t, first), unhealthy, healthyB)

	// The kubelet goes away from one stream (its context ends) while another is open.
	second, cancelSecond := watchHealth(t, version, conn)
	expectReport(t, nextReport(t, second), unhealthy, healthyB)
	cancelSecond()
	if _, err := second.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("a cancelled stream received %v, want Canceled", err)
	}
	p.command("health dev-a=healthy;dev-b=healthy")
	healthyA := healthy
	expectReport(t, nextReport(t, first), healthyA, healthyB)

	third, _ := watchHealth(t, version, conn)
	expectReport(t, nextReport(t, third), healthyA, healthyB)
	// The stream is open as the plugin stops: it ends, and the stop does not wait for it.
	p.stop()
	if _, err := first.Recv(); err == nil {
		t.Fatal("the health stream carried on after the plugin stopped")
	}
}

// A request that does not decode is InvalidArgument, and the service carries on.
func TestHealthRefusesWhatDoesNotDecode(t *testing.T) {
	for _, version := range healthVersions {
		t.Run(version.name, func(t *testing.T) { testHealthRefusesWhatDoesNotDecode(t, version) })
	}
}

func testHealthRefusesWhatDoesNotDecode(t *testing.T, version healthVersion) {
	p := startPlugin(t)
	conn := dialStyles[0].dial(t, p.draSocket())
	garbage := []byte{0xff, 0xff, 0xff}
	desc := &grpc.StreamDesc{StreamName: "NodeWatchResources", ServerStreams: true}
	stream, err := conn.NewStream(callContext(t), desc, version.method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatalf("opening a raw stream: %v", err)
	}
	if err := stream.SendMsg(&garbage); err != nil {
		t.Fatalf("sending undecodable bytes: %v", err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("CloseSend: %v", err)
	}
	var reply []byte
	if err := stream.RecvMsg(&reply); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("NodeWatchResources with undecodable bytes: %v, want InvalidArgument", err)
	}
	healthy := deviceHealth{"test-pool", "dev-a", "", healthapi.HealthStatus_HEALTHY}
	after, _ := watchHealth(t, version, conn)
	expectReport(t, nextReport(t, after), healthy)
	p.stop()
}
