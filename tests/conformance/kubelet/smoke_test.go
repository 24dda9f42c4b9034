// Smoke test: the kubelet's generated registration client builds and runs here, over a unix
// socket dialed the way the kubelet dials (bare path, custom dialer).
package kubelet

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type goRegistration struct {
	registerapi.UnimplementedRegistrationServer
}

func (goRegistration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: "DRAPlugin", Name: "smoke.example.com"}, nil
}

func TestKubeletRegistrationClientRuns(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "smoke-reg.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, goRegistration{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := dialLikeTheKubelet(socket)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != "DRAPlugin" || info.Name != "smoke.example.com" {
		t.Fatalf("GetInfo answered %+v", info)
	}
}

// dialLikeTheKubelet dials a socket by bare path with a custom unix dialer, blocking until
// connected, as the kubelet's plugin watcher does (grpc.DialContext, whose default resolver
// passes the path through to the dialer). grpc-go then sends the percent-encoded path as the
// :authority.
func dialLikeTheKubelet(socket string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	//lint:ignore SA1019 the kubelet dials with DialContext and WithBlock; we reproduce it on purpose.
	return grpc.DialContext(ctx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
}
