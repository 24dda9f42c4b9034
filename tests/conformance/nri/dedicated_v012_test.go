//go:build !nri_v080

// NRI v0.12 only: the dedicated per-event calls, and the StateChange fallback a v0.12 runtime
// takes when the plugin answers them with Unimplemented.
package nri

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/adaptation"
)

// deprecations records the adaptation's deprecation warnings; the StateChange fallback raises one.
type deprecations struct {
	mu       sync.Mutex
	warnings []string
}

func (d *deprecations) PluginWarning(_ context.Context, _ adaptation.Deprecation, plugin, details string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.warnings = append(d.warnings, plugin+": "+details)
}

func (d *deprecations) all() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.warnings...)
}

func TestDedicatedEventCallsAndStateChangeFallback(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		delivery   string
		deprecated bool
	}{
		{"dedicated", nil, "dedicated", false},
		{"fallback", []string{"--no-dedicated-events"}, "state-change", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &deprecations{}
			rt := newFakeRuntime(t, nil, nil, adaptation.WithDeprecationRecorder(d))
			args := append([]string{"--socket", rt.socket, "--events", "RUN_POD_SANDBOX,START_CONTAINER,REMOVE_CONTAINER"}, tc.args...)
			p := startPlugin(t, "scripted", args...)
			rt.waitSynchronized()
			p.expect("synchronized")
			ctx := testContext(t)
			if err := rt.r.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: pod("p0")}); err != nil {
				t.Fatalf("RunPodSandbox: %v", err)
			}
			if got, want := p.next(), "event RUN_POD_SANDBOX "+tc.delivery+" p0"; got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
			if err := startContainer(ctx, rt.r, pod("p0"), container("p0", "c0")); err != nil {
				t.Fatalf("StartContainer: %v", err)
			}
			if got, want := p.next(), "event START_CONTAINER "+tc.delivery+" c0"; got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
			if err := removeContainer(ctx, rt.r, pod("p0"), container("p0", "c0")); err != nil {
				t.Fatalf("RemoveContainer: %v", err)
			}
			if got, want := p.next(), "event REMOVE_CONTAINER "+tc.delivery+" c0"; got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
			warned := strings.Join(d.all(), "\n")
			if tc.deprecated != strings.Contains(warned, "StartContainer") {
				t.Fatalf("deprecation warnings %q (fallback expected: %v)", warned, tc.deprecated)
			}
		})
	}
}
