package clusterscenarios

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// nriEvent is what the runtime told NRI plugins about a pod or a container, and when.
type nriEvent struct {
	at        time.Time
	event     string
	pod       *api.PodSandbox
	container *api.Container
}

// nriObserver is an NRI plugin in the test's process, plugged into the node's runtime next to
// the agent: it changes nothing and records each event, so a test can say what the runtime
// tells plugins (which the agent must make do with) and when. Its index (10) puts it before the
// agent, so it sees each container as the runtime made it, before any plugin's adjustment.
type nriObserver struct {
	mu     sync.Mutex
	events []nriEvent
	stub   stub.Stub
}

// observeNRI plugs an observer into the node's runtime until the test ends.
func observeNRI(t *testing.T) *nriObserver {
	t.Helper()
	o := &nriObserver{}
	s, err := stub.New(o, stub.WithPluginName("e2e-observer"), stub.WithPluginIdx("10"),
		stub.WithSocketPath(node.NRISocket()), stub.WithOnClose(func() {}))
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Start(c); err != nil {
		t.Fatalf("plugging an observer into the runtime's NRI socket %s: %v", node.NRISocket(), err)
	}
	o.stub = s
	t.Cleanup(s.Stop)
	return o
}

func (o *nriObserver) record(event string, pod *api.PodSandbox, ctr *api.Container) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, nriEvent{at: time.Now(), event: event, pod: pod, container: ctr})
}

func (o *nriObserver) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	o.record("RunPodSandbox", pod, nil)
	return nil
}

func (o *nriObserver) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	o.record("StopPodSandbox", pod, nil)
	return nil
}

func (o *nriObserver) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	o.record("RemovePodSandbox", pod, nil)
	return nil
}

func (o *nriObserver) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	o.record("CreateContainer", pod, ctr)
	return nil, nil, nil
}

func (o *nriObserver) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	o.record("StopContainer", pod, ctr)
	return nil, nil
}

// of are the events about the pod namespace/name (its containers' included), in order.
func (o *nriObserver) of(namespace, name string) []nriEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []nriEvent
	for _, e := range o.events {
		if e.pod != nil && e.pod.Namespace == namespace && e.pod.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// first is the first event of kind event about the pod (and, if not empty, its container).
func (o *nriObserver) first(namespace, name, event, container string) (nriEvent, bool) {
	for _, e := range o.of(namespace, name) {
		if e.event == event && (container == "" || e.container != nil && e.container.Name == container) {
			return e, true
		}
	}
	return nriEvent{}, false
}

// describe lists events as lines, for messages.
func describeEvents(events []nriEvent) string {
	out := ""
	for _, e := range events {
		what := e.event
		if e.container != nil {
			what += " " + e.container.Name
		}
		out += fmt.Sprintf("\n  %s %s", e.at.Format("15:04:05.000"), what)
	}
	return out
}
