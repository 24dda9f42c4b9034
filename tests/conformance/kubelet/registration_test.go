// Registration as the kubelet's plugin watcher does it, against our registration server, and the
// upstream :authority problem our server exists to get around.
package kubelet

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	healthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// A stock tonic server (h2 underneath) resets every request whose :authority is a
// percent-encoded socket path, which is what the kubelet sends on the registration socket. This
// is the problem, reproduced; when it stops reproducing, h2 accepts such authorities and our
// rewrite (crates/kubelet-plugin/src/authority) can go.
func TestStockTonicResetsThePercentEncodedAuthority(t *testing.T) {
	p := startPlugin(t, "--stock-registration")
	byPath := dialStyles[0].dial(t, p.registrationSocket())
	_, err := registerapi.NewRegistrationClient(byPath).GetInfo(callContext(t), &registerapi.InfoRequest{})
	if err == nil {
		t.Fatal("GetInfo over a bare-path dial succeeded against a stock tonic server")
	}
	if status.Code(err) != codes.Internal {
		t.Fatalf("GetInfo failed with %v, want Internal (a reset stream)", err)
	}
	mustContain(t, "the error", err.Error(), "RST_STREAM", "PROTOCOL_ERROR")

	// The same server answers a `unix:` dial, whose authority is "localhost": the authority is
	// the whole problem.
	byTarget := dialStyles[1].dial(t, p.registrationSocket())
	info, err := registerapi.NewRegistrationClient(byTarget).GetInfo(callContext(t), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo over a unix: target: %v", err)
	}
	if info.Type != "DRAPlugin" {
		t.Fatalf("GetInfo answered %+v", info)
	}
	p.stop()
}

func TestRegistration(t *testing.T) {
	for _, style := range dialStyles {
		t.Run(style.name, func(t *testing.T) {
			p := startPlugin(t)
			client := registerapi.NewRegistrationClient(style.dial(t, p.registrationSocket()))

			info, err := client.GetInfo(callContext(t), &registerapi.InfoRequest{})
			if err != nil {
				t.Fatalf("GetInfo: %v", err)
			}
			if info.Type != "DRAPlugin" || info.Name != driverName || info.Endpoint != p.draSocket() {
				t.Fatalf("GetInfo answered type %q name %q endpoint %q; want DRAPlugin, %s, %s",
					info.Type, info.Name, info.Endpoint, driverName, p.draSocket())
			}
			// The DRA versions most preferred first, then both versions of the health service
			// under the names their upstream descriptors give them (a 1.37 kubelet opens the
			// newest one listed).
			want := strings.Join([]string{drav1.DRAPluginService, drav1beta1.DRAPluginService,
				healthv1.DRAResourceHealth_ServiceDesc.ServiceName,
				healthv1alpha1.DRAResourceHealth_ServiceDesc.ServiceName}, ",")
			if got := strings.Join(info.SupportedVersions, ","); got != want {
				t.Fatalf("supported versions %q, want %q", got, want)
			}

			// The kubelet's verdicts, on the same connection (so later requests carry the
			// :authority as an HPACK index when dialed by path).
			if _, err := client.NotifyRegistrationStatus(callContext(t),
				&registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
				t.Fatalf("NotifyRegistrationStatus(true): %v", err)
			}
			p.expectLine("registration registered")

			const reason = "no handler registered for plugin type: DRAPlugin at socket " + "x"
			if _, err := client.NotifyRegistrationStatus(callContext(t),
				&registerapi.RegistrationStatus{PluginRegistered: false, Error: reason}); err != nil {
				t.Fatalf("NotifyRegistrationStatus(false): %v", err)
			}
			p.expectLine("registration rejected: " + reason)
			mustContain(t, "the plugin's log", p.logs(), "the kubelet refused our registration", reason)

			// GetInfo keeps answering after a rejection: the kubelet retries registration.
			for i := 0; i < 3; i++ {
				if _, err := client.GetInfo(callContext(t), &registerapi.InfoRequest{}); err != nil {
					t.Fatalf("GetInfo #%d after the rejection: %v", i+2, err)
				}
			}

			p.stop()
			for _, s := range []string{p.registrationSocket(), p.draSocket()} {
				if socketExists(s) {
					t.Errorf("%s still exists after shutdown", s)
				}
			}
		})
	}
}
