// Harness for the NRI conformance tests: containerd's own runtime side
// (github.com/containerd/nri/pkg/adaptation) on a temporary socket with a fake runtime behind its
// callbacks, and a plugin process (our Rust examples) connected to it.
//
// The suite runs twice: against the NRI release in go.mod (v0.12.x) and, with the nri_v080 build
// tag and the alternate module file v080.mod, against v0.8.0 (containerd 1.7.26 to 2.1). The
// version-specific glue lives in compat_*_test.go.
package nri

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/resmgr/resmgr/tests/conformance/internal/harness"
	"github.com/resmgr/resmgr/tests/conformance/internal/rustbin"
)

// waitLimit bounds every wait for a plugin or runtime reaction; reaching it is a failure.
const waitLimit = 15 * time.Second

type syncResult struct {
	updates []*api.ContainerUpdate
	err     error
}

// fakeRuntime is the runtime behind the adaptation's callbacks: it owns the existing pods and
// containers handed to Synchronize and records (and answers) unsolicited container updates.
type fakeRuntime struct {
	t      testing.TB
	r      *adaptation.Adaptation
	socket string

	pods []*api.PodSandbox
	ctrs []*api.Container

	synced  chan syncResult
	updates chan []*api.ContainerUpdate

	mu          sync.Mutex
	updateReply func([]*api.ContainerUpdate) ([]*api.ContainerUpdate, error)
}

func newFakeRuntime(t testing.TB, pods []*api.PodSandbox, ctrs []*api.Container, opts ...adaptation.Option) *fakeRuntime {
	t.Helper()
	dir := t.TempDir()
	f := &fakeRuntime{
		t:       t,
		socket:  filepath.Join(dir, "nri.sock"),
		pods:    pods,
		ctrs:    ctrs,
		synced:  make(chan syncResult, 4),
		updates: make(chan []*api.ContainerUpdate, 16),
	}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		updates, err := cb(ctx, f.pods, f.ctrs)
		f.synced <- syncResult{updates, err}
		return err
	}
	updateFn := func(_ context.Context, req []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		f.updates <- req
		f.mu.Lock()
		reply := f.updateReply
		f.mu.Unlock()
		if reply == nil {
			return nil, nil
		}
		return reply(req)
	}
	opts = append([]adaptation.Option{
		adaptation.WithSocketPath(f.socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
	}, opts...)
	r, err := adaptation.New("fake-runtime", "0.0.1", syncFn, updateFn, opts...)
	if err != nil {
		t.Fatalf("adaptation.New: %v", err)
	}
	if err := r.Start(); err != nil {
		t.Fatalf("adaptation.Start: %v", err)
	}
	f.r = r
	t.Cleanup(r.Stop)
	// Start synchronizes the (here absent) pre-installed plugins through syncFn before it returns;
	// that result is not a plugin's.
	select {
	case <-f.synced:
	default:
		t.Fatal("adaptation.Start did not synchronize its pre-installed plugins")
	}
	return f
}

// proxy returns a socket that forwards each connection to the adaptation's; the returned cut
// closes them all, as the runtime process exiting would.
func (f *fakeRuntime) proxy() (socket string, cut func()) {
	f.t.Helper()
	socket = filepath.Join(f.t.TempDir(), "proxy.sock")
	return socket, harness.RuntimeProxy(f.t, socket, f.socket)
}

func (f *fakeRuntime) setUpdateReply(reply func([]*api.ContainerUpdate) ([]*api.ContainerUpdate, error)) {
	f.mu.Lock()
	f.updateReply = reply
	f.mu.Unlock()
}

// waitSynchronized waits until a plugin's Synchronize has returned and the adaptation has
// inserted the plugin into its invocation list. The adaptation holds its plugin-sync lock from
// before syncFn until after the insertion, so once syncFn has reported, taking that lock for
// reading (BlockPluginSync) returns exactly when the plugin is in the list. Works on every
// adaptation version, unlike the Metrics option (v0.12 only).
func (f *fakeRuntime) waitSynchronized() syncResult {
	f.t.Helper()
	select {
	case res := <-f.synced:
		f.r.BlockPluginSync().Unblock()
		return res
	case <-time.After(waitLimit):
		f.t.Fatal("the plugin was never synchronized")
		return syncResult{}
	}
}

func (f *fakeRuntime) createContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.CreateContainerResponse, error) {
	return f.r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
}

// plugin is a running plugin process with its stdout as a stream of lines.
type plugin struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *harness.LockedBuffer
	seen   []string
	exited chan error
}

// startPlugin runs a Rust example (e.g. "scripted") with args; it is killed when the test ends.
func startPlugin(t testing.TB, example string, args ...string) *plugin {
	t.Helper()
	bin, err := rustbin.Path("examples/" + example)
	if err != nil {
		t.Fatal(err)
	}
	p := &plugin{
		t:      t,
		cmd:    exec.Command(bin, args...),
		lines:  make(chan string, 1024),
		stderr: &harness.LockedBuffer{},
		exited: make(chan error, 1),
	}
	p.cmd.Stderr = p.stderr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("plugin stdout lines seen: %q", p.seen)
			t.Logf("plugin stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// expect waits for the next stdout line that starts with prefix, skipping others, and returns it.
func (p *plugin) expect(prefix string) string {
	p.t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("plugin exited before printing %q", prefix)
			}
			p.seen = append(p.seen, line)
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			p.t.Fatalf("plugin did not print %q within %v", prefix, waitLimit)
		}
	}
}

// next returns the next stdout line, whatever it is.
func (p *plugin) next() string {
	p.t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatal("plugin exited")
		}
		p.seen = append(p.seen, line)
		return line
	case <-time.After(waitLimit):
		p.t.Fatalf("plugin printed nothing within %v", waitLimit)
		return ""
	}
}

func (p *plugin) send(command string) {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.stdin, command); err != nil {
		p.t.Fatalf("writing %q to the plugin: %v", command, err)
	}
}

// waitExit waits for the plugin process to end and returns its error (nil for exit status 0).
func (p *plugin) waitExit() error {
	p.t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case line, ok := <-p.lines:
			if ok {
				p.seen = append(p.seen, line)
				continue
			}
			select {
			case err := <-p.exited:
				return err
			case <-deadline:
			}
		case <-deadline:
		}
		p.t.Fatal("plugin did not exit")
		return nil
	}
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func pod(id string) *api.PodSandbox {
	return &api.PodSandbox{Id: id, Name: "pod-" + id, Uid: "uid-" + id, Namespace: "default"}
}

func container(podID, id string) *api.Container {
	return &api.Container{Id: id, PodSandboxId: podID, Name: "ctr-" + id, State: api.ContainerState_CONTAINER_RUNNING}
}

func cpusOf(u *api.ContainerUpdate) string {
	return u.GetLinux().GetResources().GetCpu().GetCpus()
}
