package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stopGrace is how long a process has to exit after SIGTERM before it gets SIGKILL.
const stopGrace = 10 * time.Second

// Process is a child process of the test, logging to a file in the run's directory. It is
// stopped by its PID only: other runs on the same machine start the same programs.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Spawn starts a program with its output in dir/<name>.log. The child is killed if the test
// binary dies (Pdeathsig), and stopped when the test ends.
func Spawn(t testing.TB, dir, name, program string, args ...string) *Process {
	t.Helper()
	p, err := spawn(dir, name, program, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

func spawn(dir, name, program string, args ...string) (*Process, error) {
	log := fmt.Sprintf("%s/%s.log", dir, name)
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(program, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = dir
	// Dies with the test binary, also when `go test` kills it on a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, program, err)
	}
	p := &Process{Name: name, Log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// ExitError is how the process ended (nil for exit status 0); only valid after Exited.
func (p *Process) ExitError() error { return p.err }

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process (by PID) unless it has exited.
func (p *Process) Signal(sig os.Signal) error {
	if !p.Running() {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM, waits up to stopGrace, then SIGKILL, and waits for the exit. Idempotent.
func (p *Process) Stop() { p.StopWithin(stopGrace) }

// StopWithin is Stop with another grace period.
func (p *Process) StopWithin(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Tail is the end of the process's log, for failure messages.
func (p *Process) Tail(lines int) string {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// LogContains reports whether the process's log contains s.
func (p *Process) LogContains(s string) bool {
	data, err := os.ReadFile(p.Log)
	return err == nil && bytes.Contains(data, []byte(s))
}

// errExited says a process ended while we waited for it to become ready.
var errExited = errors.New("exited")

// waitReady polls ready every 100 ms until it returns nil, the process exits, or limit passes.
func (p *Process) waitReady(limit time.Duration, ready func() error) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		if last = ready(); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s %w (%v) before it was ready; its log ends:\n%s", p.Name, errExited, p.err, p.Tail(30))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s (last: %v); its log ends:\n%s", p.Name, limit, last, p.Tail(30))
		}
	}
}
