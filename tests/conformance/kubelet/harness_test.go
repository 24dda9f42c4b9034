// Harness for the kubelet conformance tests: the Rust kubelet test plugin
// (crates/kubelet-plugin/examples/kubelet-test-plugin.rs) in a child process with its own plugin and
// registry directories, and the two ways the kubelet dials a plugin socket.
package kubelet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/resmgr/resmgr/tests/conformance/internal/rustbin"
)

// waitLimit bounds every wait for the plugin; reaching it is a failure.
const waitLimit = 15 * time.Second

// driverName is the test plugin's driver name.
const driverName = "test.resmgr.io"

// plugin is a running kubelet test plugin.
type plugin struct {
	t           testing.TB
	cmd         *exec.Cmd
	pluginsDir  string
	registryDir string
	lines       chan string // stdout, one event per line
	stdin       io.WriteCloser
	exited      chan error
	stderr      string // the file the plugin logs to
}

// draSocket is the DRA socket's path, as GetInfo must report it.
func (p *plugin) draSocket() string {
	return filepath.Join(p.pluginsDir, driverName, "dra.sock")
}

// registrationSocket is the registration socket's path.
func (p *plugin) registrationSocket() string {
	return filepath.Join(p.registryDir, driverName+"-reg.sock")
}

// logs is what the plugin logged so far. The plugin writes its log file directly (no pipe in
// between), so everything it logged before printing an event line is here once that line has
// been read.
func (p *plugin) logs() string {
	b, err := os.ReadFile(p.stderr)
	if err != nil {
		p.t.Fatalf("reading the plugin's log: %v", err)
	}
	return string(b)
}

// startPlugin runs the test plugin with fresh directories and waits until it is serving. The
// directories are short (unix socket paths are limited to 108 bytes), so they live directly
// under the system temp directory rather than under t.TempDir().
func startPlugin(t testing.TB, extraArgs ...string) *plugin {
	t.Helper()
	bin, err := rustbin.Path("examples/kubelet-test-plugin")
	if err != nil {
		t.Fatalf("locating the kubelet test plugin: %v", err)
	}
	root, err := os.MkdirTemp("", "kl")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	p := &plugin{
		t:           t,
		pluginsDir:  filepath.Join(root, "plugins"),
		registryDir: filepath.Join(root, "plugins_registry"),
		lines:       make(chan string, 64),
		exited:      make(chan error, 1),
		stderr:      filepath.Join(root, "plugin.log"),
	}
	args := append([]string{
		"--driver", driverName,
		"--plugins-dir", p.pluginsDir,
		"--registry-dir", p.registryDir,
	}, extraArgs...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "RUST_LOG=info")
	logFile, err := os.Create(p.stderr)
	if err != nil {
		t.Fatalf("creating the plugin's log file: %v", err)
	}
	defer logFile.Close() // the child has its own descriptor
	p.cmd.Stderr = logFile
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatalf("stdin pipe: %v", err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("stdout pipe: %v", err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			p.lines <- scanner.Text()
		}
		close(p.lines)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("plugin logs:\n%s", p.logs())
		}
	})
	p.expectLine("ready")
	return p
}

// expectLine waits for the plugin to print exactly `want` on stdout; other lines in between
// fail the test.
func (p *plugin) expectLine(want string) {
	p.t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("plugin exited before printing %q; logs:\n%s", want, p.logs())
		}
		if line != want {
			p.t.Fatalf("plugin printed %q, want %q", line, want)
		}
	case <-time.After(waitLimit):
		p.t.Fatalf("plugin did not print %q within %v", want, waitLimit)
	}
}

// command writes one line to the plugin's stdin (see the test plugin's docs).
func (p *plugin) command(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatalf("writing %q to the plugin: %v", line, err)
	}
}

// stop sends SIGTERM and waits for an orderly exit.
func (p *plugin) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("SIGTERM: %v", err)
	}
	p.expectLine("stopped")
	select {
	case err := <-p.exited:
		if err != nil {
			p.t.Fatalf("plugin exited with %v; logs:\n%s", err, p.logs())
		}
	case <-time.After(waitLimit):
		p.t.Fatalf("plugin did not exit within %v", waitLimit)
	}
}

// dialStyle is one way the kubelet dials a plugin socket.
type dialStyle struct {
	name string
	dial func(t testing.TB, socket string) *grpc.ClientConn
}

// dialStyles are both of them:
//   - "bare-path": grpc.DialContext on the bare socket path with a custom unix dialer, as the
//     kubelet's plugin watcher dials every registration socket (and 1.32/1.33 kubelets dial the
//     DRA socket). grpc-go then sends the percent-encoded path as :authority.
//   - "unix-target": a `unix:` target, as 1.34+ kubelets dial the DRA socket; :authority is
//     "localhost".
var dialStyles = []dialStyle{
	{"bare-path", func(t testing.TB, socket string) *grpc.ClientConn {
		t.Helper()
		conn, err := dialLikeTheKubelet(socket)
		if err != nil {
			t.Fatalf("dialing %s by path: %v", socket, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}},
	{"unix-target", func(t testing.TB, socket string) *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient("unix:"+socket,
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatalf("dialing unix:%s: %v", socket, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}},
}

// callContext is the deadline for one call: the kubelet's own are 1 s (GetInfo) to 45 s.
func callContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// rawCodec sends and receives message bytes unchanged, to send what no generated client would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec marshals *[]byte, not %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec unmarshals into *[]byte, not %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// socketExists reports whether a file exists at path.
func socketExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// unixDial connects to a socket, for checks that a socket answers (or not) at all.
func unixDial(path string) error {
	conn, err := net.DialTimeout("unix", path, waitLimit)
	if err != nil {
		return err
	}
	return conn.Close()
}

// mustContain fails unless s contains every one of subs.
func mustContain(t testing.TB, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Fatalf("%s does not contain %q:\n%s", what, sub, s)
		}
	}
}
