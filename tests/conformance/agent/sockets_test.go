package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// The kubelet's plugin watcher (fsnotify on the registry directory) stats every name that
// appears there when it gets to the event and logs an error for one already gone, then
// registers every socket whose name does not start with a dot. So `resmgr run` must make its
// registration socket appear under its final name only, with nothing appearing there for a
// moment. The watcher here gets to the events only once the agent is registered: the latest a
// busy kubelet could.
func TestRegistrySeesFinalNames(t *testing.T) {
	var watcher *fsnotify.Watcher
	registry := ""
	c := startSetup(t, setup{dra: true, topology: "pack:1 numa:2 core:4 pu:2", before: func(c *cluster) {
		registry = c.path("plugins_registry")
		if err := os.MkdirAll(registry, 0o750); err != nil {
			t.Fatal(err)
		}
		var err error
		if watcher, err = fsnotify.NewBufferedWatcher(256); err != nil {
			t.Fatalf("fsnotify: %v", err)
		}
		t.Cleanup(func() { _ = watcher.Close() })
		if err := watcher.Add(registry); err != nil {
			t.Fatalf("watching %s: %v", registry, err)
		}
	}})
	c.ready()

	socket := filepath.Join(registry, driver+"-reg.sock")
	var appeared []string
	// Events arrive in order: once the socket's own is in, every earlier one is too.
	for seen := false; !seen; {
		select {
		case event := <-watcher.Events:
			if event.Has(fsnotify.Create) {
				appeared = append(appeared, event.Name)
				seen = event.Name == socket
			}
		case err := <-watcher.Errors:
			t.Fatalf("fsnotify: %v", err)
		case <-time.After(waitLimit):
			t.Fatalf("no create event for %s; saw %v", socket, appeared)
		}
	}
	for _, name := range appeared {
		info, err := os.Stat(name)
		if err != nil {
			t.Fatalf("%s appeared in the registry directory and is gone (the kubelet logs an error for it): %v; all that appeared: %v",
				name, err, appeared)
		}
		if info.Mode()&os.ModeSocket != 0 && !strings.HasPrefix(filepath.Base(name), ".") && name != socket {
			t.Fatalf("a socket the kubelet would register appeared besides ours: %s", name)
		}
	}
}
