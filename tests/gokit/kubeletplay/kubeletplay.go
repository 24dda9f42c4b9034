// Package kubeletplay plays the kubelet's side of a DRA driver's sockets with the kubelet's own
// generated clients, for the Go tests of every module under tests/: the plugin watcher's
// registration (GetInfo, then NotifyRegistrationStatus) and the DRA manager's connection.
package kubeletplay

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Register does what the kubelet's plugin watcher does with a registration socket that
// appeared: dials it by path as the watcher does (so grpc-go sends the percent-encoded path as
// :authority), asks GetInfo, checks the answer with accept, and tells the plugin whether it is
// registered: if accept refuses, the plugin is told why and the refusal returned. The socket's
// file appears at bind, a system call before the plugin listens, and a connection made in
// between is refused: the watcher dials blocking, retrying that, and so does this, until ctx
// ends.
func Register(ctx context.Context, socket string, accept func(*registerapi.PluginInfo) error) (*registerapi.PluginInfo, error) {
	//lint:ignore SA1019 the kubelet's plugin watcher dials with DialContext.
	conn, err := grpc.DialContext(ctx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return nil, fmt.Errorf("dialing the registration socket %s: %w", socket, err)
	}
	defer conn.Close()
	client := registerapi.NewRegistrationClient(conn)
	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, fmt.Errorf("GetInfo on %s: %w", socket, err)
	}
	refused := accept(info)
	status := &registerapi.RegistrationStatus{PluginRegistered: refused == nil}
	if refused != nil {
		status.Error = refused.Error()
	}
	if _, err := client.NotifyRegistrationStatus(ctx, status); err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus on %s: %w", socket, err)
	}
	if refused != nil {
		return nil, fmt.Errorf("the plugin on %s answered GetInfo with %+v: %w", socket, info, refused)
	}
	return info, nil
}

// DRAClient connects to a DRA plugin's socket as the kubelet's DRA manager does; close the
// connection when done.
func DRAClient(endpoint string) (drav1.DRAPluginClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix:"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("dialing the DRA socket %s: %w", endpoint, err)
	}
	return drav1.NewDRAPluginClient(conn), conn, nil
}
