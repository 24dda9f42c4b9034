// The DRA resource health stream as the kubelet opens it (NodeWatchResources, with the
// generated v1alpha1 client of the kubelet 1.36 API), over both ways the kubelet dials.
package kubelet

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	healthapi "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// watchHealth opens a stream with its own context, which cancel ends (the kubelet's way of
// going away).
func watchHealth(t *testing.T, conn *grpc.ClientConn) (healthapi.DRAResourceHealth_NodeWatchResourcesClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	stream, err := healthapi.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &healthapi.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatalf("NodeWatchResources: %v", err)
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
	for _, style := range dialStyles {
		t.Run(style.name, func(t *testing.T) {
			p := startPlugin(t)
			conn := style.dial(t, p.draSocket())
			first, _ := watchHealth(t, conn)
			healthy := deviceHealth{"test-pool", "dev-a", "", healthapi.HealthStatus_HEALTHY}
			expectReport(t, nextReport(t, first), healthy)

			p.command("health dev-a=unhealthy:cpus 3 are offline;dev-b=healthy")
			unhealthy := deviceHealth{"test-pool", "dev-a", "cpus 3 are offline", healthapi.HealthStatus_UNHEALTHY}
			healthyB := deviceHealth{"test-pool", "dev-b", "", healthapi.HealthStatus_HEALTHY}
			expectReport(t, nextReport(t, first), unhealthy, healthyB)

			// The kubelet goes away from one stream (its context ends) while another is open.
			second, cancelSecond := watchHealth(t, conn)
			expectReport(t, nextReport(t, second), unhealthy, healthyB)
			cancelSecond()
			if _, err := second.Recv(); status.Code(err) != codes.Canceled {
				t.Fatalf("a cancelled stream received %v, want Canceled", err)
			}
			p.command("health dev-a=healthy;dev-b=healthy")
			healthyA := healthy
			expectReport(t, nextReport(t, first), healthyA, healthyB)

			third, _ := watchHealth(t, conn)
			expectReport(t, nextReport(t, third), healthyA, healthyB)
			// The stream is open as the plugin stops: it ends, and the stop does not wait for it.
			p.stop()
			if _, err := first.Recv(); err == nil {
				t.Fatal("the health stream carried on after the plugin stopped")
			}
		})
	}
}

// A request that does not decode is InvalidArgument, and the service carries on.
func TestHealthRefusesWhatDoesNotDecode(t *testing.T) {
	p := startPlugin(t)
	conn := dialStyles[0].dial(t, p.draSocket())
	garbage := []byte{0xff, 0xff, 0xff}
	desc := &grpc.StreamDesc{StreamName: "NodeWatchResources", ServerStreams: true}
	stream, err := conn.NewStream(callContext(t), desc, "/v1alpha1.DRAResourceHealth/NodeWatchResources", grpc.ForceCodec(rawCodec{}))
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
	after, _ := watchHealth(t, conn)
	expectReport(t, nextReport(t, after), healthy)
	p.stop()
}
