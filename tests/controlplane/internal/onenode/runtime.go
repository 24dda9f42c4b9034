package onenode

// The node's container runtime, a parameter of the cluster (Config.Runtime): containerd 2.4
// with runc, or CRI-O 1.36 with conmon and runc. The kubelet, the chart and the scenarios are
// the same on both; what differs is here: the runtime's configuration (everything under the
// run directory, NRI on, CDI specs from the agent's directory, the pods' network from the run's
// CNI configuration), how it starts, how images reach it (the node pulls nothing from a
// registry), and how it names a container's cgroup. A scenario never asks which runtime it runs
// on; one that checks what a runtime does differently asks the Node (Node.Runtime).

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Runtime names a container runtime the node can run.
type Runtime string

const (
	// Containerd is containerd 2.4 with runc (the containerd stage's build).
	Containerd Runtime = "containerd"
	// CRIO is CRI-O 1.36 with conmon and runc (the CRI-O stage's build), NRI switched on by the
	// drop-in docs/deploy.md gives operators.
	CRIO Runtime = "crio"
)

// RuntimeDaemon is the name Node.Stop and Node.Start take for the node's runtime, whichever it
// is (its process and log are named after it: containerd, crio).
const RuntimeDaemon = "runtime"

// runtime is what the node does differently per container runtime.
type runtime interface {
	// daemon is the runtime's process name (its log is logs/<daemon>.log).
	daemon() string
	// socket is its CRI socket.
	socket() string
	// start writes its configuration, starts it in the run's namespaces and waits until it
	// serves CRI.
	start(n *Node) error
	// load makes the image archive, named name, available to pods (never pulled by the kubelet).
	load(n *Node, archive, name string) error
	// cgroupName is the name of a container's cgroup under its pod's (cgroupfs driver).
	cgroupName(containerID string) string
}

func runtimeOf(r Runtime, l layout) (runtime, error) {
	switch r {
	case Containerd, "":
		return containerdRuntime{l: l}, nil
	case CRIO:
		return crioRuntime{l: l}, nil
	}
	return nil, fmt.Errorf("no container runtime %q: the node runs %q or %q", r, Containerd, CRIO)
}

// === containerd ===

type containerdRuntime struct{ l layout }

func (containerdRuntime) daemon() string { return "containerd" }

func (c containerdRuntime) socket() string { return c.l.at("containerd/containerd.sock") }

// containerd names a container's cgroup after its ID.
func (containerdRuntime) cgroupName(id string) string { return id }

func (c containerdRuntime) start(n *Node) error {
	config := c.l.at("containerd/config.toml")
	if err := os.WriteFile(config, []byte(containerdConfig(c.l, c.socket(), n.cfg.Runc, n.cfg.CNI, n.cfg.TestImageName, false)), 0o644); err != nil {
		return err
	}
	// containerd finds its shim on PATH.
	if _, err := n.spawn(c.daemon(), true, "env", "PATH="+n.cfg.Containerd+":"+os.Getenv("PATH"),
		filepath.Join(n.cfg.Containerd, "containerd"), "--config", config); err != nil {
		return err
	}
	return n.waitFor("containerd's socket", c.daemon(), time.Minute, func() (bool, error) {
		err := exec.Command(filepath.Join(n.cfg.Containerd, "ctr"), "--address", c.socket(), "version").Run()
		return err == nil, err
	})
}

// load imports the archive into the CRI's namespace; containerd names the image from the
// archive's annotation.
func (c containerdRuntime) load(n *Node, archive, _ string) error {
	return run(filepath.Join(n.cfg.Containerd, "ctr"), "--address", c.socket(),
		"--namespace", "k8s.io", "images", "import", "--local", archive)
}

// === CRI-O ===

type crioRuntime struct{ l layout }

func (crioRuntime) daemon() string { return "crio" }

func (c crioRuntime) socket() string { return c.l.at("crio/crio.sock") }

// CRI-O's cgroupfs manager names a container's cgroup crio-<ID> (its conmon's crio-conmon-<ID>).
func (crioRuntime) cgroupName(id string) string { return "crio-" + id }

func (c crioRuntime) start(n *Node) error {
	for _, d := range []string{"crio/conf.d", "crio/images", "crio/tmp"} {
		if err := os.MkdirAll(c.l.at(d), 0o755); err != nil {
			return err
		}
	}
	doc, err := os.ReadFile(n.cfg.DeployDoc)
	if err != nil {
		return err
	}
	name, dropin, err := deployDropin(string(doc))
	if err != nil {
		return fmt.Errorf("%s: %w", n.cfg.DeployDoc, err)
	}
	if name >= crioRunDropin {
		return fmt.Errorf("the documented drop-in %s sorts after the run's own %s", name, crioRunDropin)
	}
	wrapper := c.l.at("crio/runc")
	files := map[string]string{
		c.l.at("crio/crio.conf"):               crioConfig(c.l, c.socket(), wrapper, n.cfg.Conmon, n.cfg.Crio, n.cfg.CNI, n.cfg.TestImageName, false),
		c.l.at("crio/conf.d/" + name):          dropin,
		c.l.at("crio/conf.d/" + crioRunDropin): crioNRISocketDropin(c.l),
		c.l.at("crio/policy.json"):             `{"default": [{"type": "insecureAcceptAnything"}]}`,
	}
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(wrapper, []byte(runcWrapper(n.cfg.Runc)), 0o755); err != nil {
		return err
	}
	if _, err := n.spawn(c.daemon(), true, filepath.Join(n.cfg.Crio, "crio"), "--config", c.l.at("crio/crio.conf"),
		"--config-dir", c.l.at("crio/conf.d"), "--log-level", "info"); err != nil {
		return err
	}
	return n.waitFor("CRI-O's CRI service", c.daemon(), time.Minute, func() (bool, error) {
		_, err := c.crictl(n, "version")
		return err == nil, err
	})
}

// load links the archive under the image's repository in the directory CRI-O's default
// transport (oci-archive:) reads, and has CRI-O pull it from there through its own image
// service, as the CRI-O stage does: the archive's tag (org.opencontainers.image.ref.name) is
// the name's.
func (c crioRuntime) load(n *Node, archive, name string) error {
	i := strings.LastIndex(name, ":")
	if i <= 0 || strings.Contains(name[:i], "..") {
		return fmt.Errorf("the image name %q has no tag", name)
	}
	link := filepath.Join(c.l.at("crio/images"), name[:i])
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	_ = os.Remove(link)
	if err := os.Symlink(archive, link); err != nil {
		return err
	}
	_, err := c.crictl(n, "pull", name)
	return err
}

// crictl runs the containerd build's crictl against CRI-O.
func (c crioRuntime) crictl(n *Node, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(n.cfg.Containerd, "crictl"), append([]string{
		"--runtime-endpoint", "unix://" + c.socket(), "--image-endpoint", "unix://" + c.socket(), "--timeout", "60s"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// crioRunDropin is the run's drop-in after the documented one: the run's NRI socket.
const crioRunDropin = "95-cluster-run.conf"

// deployHeading is what docs/deploy.md puts above the CRI-O drop-in, naming its file (the
// CRI-O stage reads it the same way: tests/src/bin/e2e/crio.rs).
const deployHeading = "**CRI-O** (a drop-in, `/etc/crio/crio.conf.d/"

// deployDropin is the drop-in docs/deploy.md gives operators for CRI-O: its file name and text.
func deployDropin(doc string) (name, text string, err error) {
	i := strings.Index(doc, deployHeading)
	if i < 0 {
		return "", "", errors.New("no CRI-O drop-in")
	}
	rest := doc[i+len(deployHeading):]
	name, _, _ = strings.Cut(rest, "`")
	if !strings.HasSuffix(name, ".conf") || strings.Contains(name, "/") {
		return "", "", errors.New("the CRI-O drop-in's heading names no file")
	}
	_, body, ok := strings.Cut(rest, "```toml\n")
	if ok {
		body, _, ok = strings.Cut(body, "\n```")
	}
	if !ok {
		return "", "", errors.New("the CRI-O drop-in has no toml block")
	}
	return name, body + "\n", nil
}

// runcWrapper is the OCI runtime CRI-O runs: runc, with a container's oom_score_adj raised to
// the runtime's own where the kubelet asks for less. The kubelet gives Guaranteed and critical
// pods (the agent's) -997 and CRI-O its infra containers -998, and lowering a process's
// oom_score_adj below its parent's takes CAP_SYS_RESOURCE, which the containers the e2e runs in
// lack. containerd has an option for exactly this (restrict_oom_score_adj, on in the run's
// containerd); CRI-O has none, so the wrapper does what that option does, to the bundle's
// config.json before `runc create` reads it. Nothing else is changed; on a node with the
// capability it is not needed.
func runcWrapper(runc string) string {
	return fmt.Sprintf(`#!/bin/sh
# runc for one resmgr cluster's CRI-O: oom_score_adj no lower than ours (onenode/runtime.go).
bundle=
prev=
for arg in "$@"; do
	case "$prev" in --bundle|-b) bundle=$arg ;; esac
	case "$arg" in --bundle=*) bundle=${arg#--bundle=} ;; esac
	prev=$arg
done
own=$(cat /proc/self/oom_score_adj)
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
	sed -i -E "s/\"oomScoreAdj\": *-[0-9]+/\"oomScoreAdj\": $own/" "$bundle/config.json"
fi
exec %s "$@"
`, shellQuote(runc))
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
