// NodePrepareResources and NodeUnprepareResources as the kubelet calls them, with the kubelet's
// generated v1 and v1beta1 clients, over both ways the kubelet dials.
package kubelet

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
)

// claim names a claim the way the kubelet does.
type claim struct{ namespace, uid, name string }

// device is a prepared device, whichever version carried it.
type device struct {
	requestNames []string
	pool, name   string
	cdiIDs       []string
	shareID      *string
}

// prepared is one claim's prepare answer.
type prepared struct {
	devices []device
	err     string
}

// draClient is one DRA version's client, reduced to what the tests compare.
type draClient interface {
	prepare(ctx context.Context, claims []claim) (map[string]prepared, error)
	unprepare(ctx context.Context, claims []claim) (map[string]string, error)
}

type v1Client struct{ c drav1.DRAPluginClient }

func (v v1Client) prepare(ctx context.Context, claims []claim) (map[string]prepared, error) {
	req := &drav1.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1.Claim{Namespace: c.namespace, Uid: c.uid, Name: c.name})
	}
	resp, err := v.c.NodePrepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]prepared{}
	for uid, r := range resp.Claims {
		var p prepared
		p.err = r.Error
		for _, d := range r.Devices {
			p.devices = append(p.devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds, d.ShareId})
		}
		out[uid] = p
	}
	return out, nil
}

func (v v1Client) unprepare(ctx context.Context, claims []claim) (map[string]string, error) {
	req := &drav1.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1.Claim{Namespace: c.namespace, Uid: c.uid, Name: c.name})
	}
	resp, err := v.c.NodeUnprepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for uid, r := range resp.Claims {
		out[uid] = r.Error
	}
	return out, nil
}

type v1beta1Client struct{ c drav1beta1.DRAPluginClient }

func (v v1beta1Client) prepare(ctx context.Context, claims []claim) (map[string]prepared, error) {
	req := &drav1beta1.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c.namespace, Uid: c.uid, Name: c.name})
	}
	resp, err := v.c.NodePrepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]prepared{}
	for uid, r := range resp.Claims {
		var p prepared
		p.err = r.Error
		for _, d := range r.Devices {
			// v1beta1 has no share id.
			p.devices = append(p.devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds, nil})
		}
		out[uid] = p
	}
	return out, nil
}

func (v v1beta1Client) unprepare(ctx context.Context, claims []claim) (map[string]string, error) {
	req := &drav1beta1.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c.namespace, Uid: c.uid, Name: c.name})
	}
	resp, err := v.c.NodeUnprepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for uid, r := range resp.Claims {
		out[uid] = r.Error
	}
	return out, nil
}

// versions are the DRA services we serve, as the kubelet's clients for them.
var versions = []struct {
	name      string
	newClient func(grpc.ClientConnInterface) draClient
	shares    bool
}{
	{"v1", func(c grpc.ClientConnInterface) draClient { return v1Client{drav1.NewDRAPluginClient(c)} }, true},
	{"v1beta1", func(c grpc.ClientConnInterface) draClient { return v1beta1Client{drav1beta1.NewDRAPluginClient(c)} }, false},
}

func keys[V any](m map[string]V) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

func TestDRA(t *testing.T) {
	p := startPlugin(t)
	for _, version := range versions {
		for _, style := range dialStyles {
			t.Run(version.name+"/"+style.name, func(t *testing.T) {
				client := version.newClient(style.dial(t, p.draSocket()))
				testDRA(t, client, version.shares)
			})
		}
	}
	p.stop()
}

func testDRA(t *testing.T, client draClient, shares bool) {
	ok := claim{"ns", "uid-a", "ok-a"}
	shared := claim{"ns", "uid-b", "shared-b"}
	failing := claim{"ns", "uid-c", "fail-c"}

	t.Run("prepare a batch with one failing claim", func(t *testing.T) {
		got, err := client.prepare(callContext(t), []claim{ok, shared, failing})
		if err != nil {
			t.Fatalf("NodePrepareResources: %v", err)
		}
		if k := keys(got); k != "uid-a,uid-b,uid-c" {
			t.Fatalf("answered claims %s, want exactly uid-a,uid-b,uid-c", k)
		}
		a := got["uid-a"]
		if a.err != "" || len(a.devices) != 1 {
			t.Fatalf("uid-a: %+v", a)
		}
		d := a.devices[0]
		if d.pool != "test-pool" || d.name != "dev-ok-a" ||
			strings.Join(d.requestNames, ",") != "req-0" ||
			strings.Join(d.cdiIDs, ",") != "test.resmgr.io/claim=uid-a" || d.shareID != nil {
			t.Fatalf("uid-a device: %+v", d)
		}
		b := got["uid-b"]
		if b.err != "" || len(b.devices) != 1 {
			t.Fatalf("uid-b: %+v", b)
		}
		switch sid := b.devices[0].shareID; {
		case shares && (sid == nil || *sid != "share-uid-b"):
			t.Fatalf("uid-b share id %v, want share-uid-b", sid)
		case !shares && sid != nil:
			t.Fatalf("uid-b share id %v on a version without shares", *sid)
		}
		c := got["uid-c"]
		if len(c.devices) != 0 {
			t.Fatalf("the failing claim came with devices: %+v", c)
		}
		mustContain(t, "uid-c's error", c.err, "prepare of claim ns/fail-c fails on purpose")
	})

	t.Run("unprepare a batch with one failing claim", func(t *testing.T) {
		got, err := client.unprepare(callContext(t), []claim{ok, failing, shared})
		if err != nil {
			t.Fatalf("NodeUnprepareResources: %v", err)
		}
		if k := keys(got); k != "uid-a,uid-b,uid-c" {
			t.Fatalf("answered claims %s, want exactly uid-a,uid-b,uid-c", k)
		}
		if got["uid-a"] != "" || got["uid-b"] != "" {
			t.Fatalf("unprepare errors: %v", got)
		}
		mustContain(t, "uid-c's error", got["uid-c"], "unprepare of claim ns/fail-c fails on purpose")
	})

	t.Run("empty requests", func(t *testing.T) {
		prep, err := client.prepare(callContext(t), nil)
		if err != nil || len(prep) != 0 {
			t.Fatalf("empty NodePrepareResources: %v, %v", prep, err)
		}
		unprep, err := client.unprepare(callContext(t), nil)
		if err != nil || len(unprep) != 0 {
			t.Fatalf("empty NodeUnprepareResources: %v, %v", unprep, err)
		}
	})

	t.Run("a refused request is Unavailable as a whole", func(t *testing.T) {
		_, err := client.prepare(callContext(t), []claim{ok, {"refuse", "uid-r", "r"}})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("got %v, want Unavailable", err)
		}
		mustContain(t, "the refusal", status.Convert(err).Message(), "still synchronizing")
	})

	t.Run("a claim without uid is InvalidArgument", func(t *testing.T) {
		_, err := client.prepare(callContext(t), []claim{ok, {"ns", "", "no-uid"}})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("got %v, want InvalidArgument", err)
		}
		mustContain(t, "the error", status.Convert(err).Message(), "claim 1", "empty uid")
	})

	t.Run("concurrent calls on one connection", func(t *testing.T) {
		// The kubelet's pod workers run in parallel over one connection.
		const n = 32
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				c := claim{"ns", fmt.Sprintf("uid-%d", i), fmt.Sprintf("pod-%d", i)}
				got, err := client.prepare(callContext(t), []claim{c})
				switch {
				case err != nil:
					errs <- err
				case len(got[c.uid].devices) != 1 || got[c.uid].devices[0].name != "dev-"+c.name:
					errs <- fmt.Errorf("claim %s answered %+v", c.uid, got)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// A request whose bytes are not a protobuf message is InvalidArgument, on both versions.
func TestMalformedMessageIsInvalidArgument(t *testing.T) {
	p := startPlugin(t)
	conn := dialStyles[0].dial(t, p.draSocket())
	// Field 1 (claims), length-delimited, claiming 100 bytes of which 2 follow.
	garbage := []byte{0x0a, 100, 1, 2}
	for _, method := range []string{
		"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
		"/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
	} {
		var reply []byte
		err := conn.Invoke(callContext(t), method, &garbage, &reply, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s with undecodable bytes: %v, want InvalidArgument", method, err)
		}
	}
	// The server is still there.
	if _, err := (v1Client{drav1.NewDRAPluginClient(conn)}).prepare(callContext(t), nil); err != nil {
		t.Fatalf("empty prepare after the malformed ones: %v", err)
	}
	p.stop()
}
