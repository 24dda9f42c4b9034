// Package harness holds what several conformance suites need around the peers they drive: a
// log buffer that goroutines write while a test reads it, and a proxy in front of a runtime's NRI
// socket that can make the runtime go away.
package harness

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// LockedBuffer collects a child process's output, written from one goroutine and read by the test.
type LockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// RuntimeProxy listens on front and forwards each connection to the runtime's socket at back.
// cut closes the listener and every forwarded connection: that is what a plugin sees when the
// runtime process exits (the adaptation's Stop closes its listener but leaves external plugins'
// connections open). cut also runs when the test ends.
func RuntimeProxy(t testing.TB, front, back string) (cut func()) {
	t.Helper()
	l, err := net.Listen("unix", front)
	if err != nil {
		t.Fatalf("proxy listen on %s: %v", front, err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			plugin, err := l.Accept()
			if err != nil {
				return
			}
			runtime, err := net.Dial("unix", back)
			if err != nil {
				plugin.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, plugin, runtime)
			mu.Unlock()
			go func() { _, _ = io.Copy(runtime, plugin); runtime.Close() }()
			go func() { _, _ = io.Copy(plugin, runtime); plugin.Close() }()
		}
	}()
	var once sync.Once
	cut = func() {
		once.Do(func() {
			l.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
	}
	t.Cleanup(cut)
	return cut
}
