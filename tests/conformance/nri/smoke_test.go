//go:build !nri_v080

// Smoke test: the upstream NRI runtime side builds and runs here, and a plugin made with the
// upstream stub registers, synchronizes and receives CreateContainer through it.
package nri

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// pluginCount reports the adaptation's active plugin count: the adaptation inserts a plugin into
// its invocation list only after Synchronize has returned, and this is the one signal of that.
type pluginCount chan int

func (pluginCount) RecordPluginInvocation(string, string, error)                               {}
func (pluginCount) RecordPluginLatency(string, string, time.Duration)                          {}
func (pluginCount) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {}
func (c pluginCount) UpdatePluginCount(n int)                                                  { c <- n }

type goPlugin struct{ created chan string }

func (p *goPlugin) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.created <- c.Id
	adjust := &api.ContainerAdjustment{}
	adjust.SetLinuxCPUSetCPUs("0-1")
	return adjust, nil, nil
}

func TestAdaptationServesAGoStubPlugin(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	active := make(pluginCount, 4)
	updateFn := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("fake-runtime", "0.0.1", syncFn, updateFn,
		adaptation.WithSocketPath(socket), adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")), adaptation.WithMetrics(active))
	if err != nil {
		t.Fatalf("adaptation.New: %v", err)
	}
	if err := r.Start(); err != nil {
		t.Fatalf("adaptation.Start: %v", err)
	}
	defer r.Stop()

	p := &goPlugin{created: make(chan string, 1)}
	s, err := stub.New(p, stub.WithSocketPath(socket), stub.WithPluginName("smoke"), stub.WithPluginIdx("10"))
	if err != nil {
		t.Fatalf("stub.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("stub.Start: %v", err)
	}
	defer s.Stop()
	for n := 0; n != 1; {
		select {
		case n = <-active:
		case <-ctx.Done():
			t.Fatal("the plugin never became active")
		}
	}

	reply, err := r.CreateContainer(ctx, &api.CreateContainerRequest{
		Pod:       &api.PodSandbox{Id: "pod0", Name: "pod", Uid: "uid0", Namespace: "default"},
		Container: &api.Container{Id: "ctr0", PodSandboxId: "pod0", Name: "ctr"},
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	select {
	case got := <-p.created:
		if got != "ctr0" {
			t.Fatalf("plugin saw container %q, want ctr0", got)
		}
	default:
		t.Fatalf("CreateContainer returned %+v without calling the plugin", reply)
	}
	if got := reply.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus(); got != "0-1" {
		t.Fatalf("adjusted cpuset %q, want 0-1", got)
	}
}
