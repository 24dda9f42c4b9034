package onenode

// The node's side of a cluster whose node is a VM (vm.go): the container runtime and the
// kubelet as systemd units of the guest, as a node installed by a distribution's packages
// runs them, enabled so that they start again on every boot, with the systemd cgroup driver on
// both sides (runc's SystemdCgroup, CRI-O's cgroup_manager, the kubelet's cgroupDriver) and
// every other setting as on this machine's node (configs.go), under guestLayout instead of the
// run directory. The kubelet's failCgroupV1 and its MemoryQoS gate are left at their defaults.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// guestLayout is where the node keeps things in the guest: the run's files under /var/lib (on
// the disk, kept across reboots), the kubelet's root where a distribution puts it, and the CDI
// specs in /var/run/cdi, a tmpfs a reboot empties, as on a real node.
var guestLayout = layout{Dir: "/var/lib/resmgr-node", KubeletRoot: "/var/lib/kubelet", CDIDir: "/var/run/cdi"}

// Guest paths of what the guest runs: Debian's runc, conmon and CNI plugins from the image, the
// rest from the share.
const (
	guestRunc   = "/usr/sbin/runc"
	guestConmon = "/usr/bin/conmon"
	guestCNI    = "/usr/lib/cni"
)

// guestShared is a path under the share (EnvVMShare) as the guest sees it.
func guestShared(rel string) string { return filepath.Join(vmShare, rel) }

// unit is a systemd service of the node.
func unit(description, after, execStart string, extra ...string) string {
	return fmt.Sprintf(`# The resmgr node's %[1]s (onenode/vmnode.go).
[Unit]
Description=%[1]s
After=network-online.target %[2]s
Wants=network-online.target

[Service]
ExecStart=%[3]s
Restart=always
RestartSec=2
Delegate=yes
LimitNOFILE=1048576
%[4]s

[Install]
WantedBy=multi-user.target
`, description, after, execStart, strings.Join(extra, "\n"))
}

// startRuntimeInVM writes the runtime's configuration and unit into the guest and starts it;
// loadImagesInVM loads the images.
func (n *Node) startRuntimeInVM() error {
	g := guestLayout
	v := n.vm
	if _, err := v.Run("mkdir -p " + strings.Join([]string{g.at("containerd"), g.at("nri/plugins"), g.at("nri/conf.d"),
		g.at("cni/net.d"), g.at("cni/ipam"), g.at("crio/conf.d"), g.at("crio/images"), g.at("crio/tmp"),
		g.at("logs"), g.at("pki"), g.at("agent-state")}, " ")); err != nil {
		return err
	}
	if err := v.WriteFile(g.at("cni/net.d/10-resmgr-cluster.conflist"), []byte(cniConfig(g, true)), 0o644); err != nil {
		return err
	}
	switch n.cfg.Runtime {
	case CRIO:
		doc, err := readFile(n.cfg.DeployDoc)
		if err != nil {
			return err
		}
		name, dropin, err := deployDropin(doc)
		if err != nil {
			return fmt.Errorf("%s: %w", n.cfg.DeployDoc, err)
		}
		files := map[string]string{
			g.at("crio/crio.conf"): crioConfig(g, n.rt.socket(), guestRunc, guestConmon, guestShared("crio"), guestCNI,
				n.cfg.TestImageName, true),
			g.at("crio/conf.d/" + name):          dropin,
			g.at("crio/conf.d/" + crioRunDropin): crioNRISocketDropin(g),
			g.at("crio/policy.json"):             `{"default": [{"type": "insecureAcceptAnything"}]}`,
			"/etc/systemd/system/crio.service": unit("CRI-O", "", guestShared("crio/crio")+" --config "+g.at("crio/crio.conf")+
				" --config-dir "+g.at("crio/conf.d")+" --log-level info", "Environment=PATH="+guestShared("containerd")+":/usr/sbin:/usr/bin:/sbin:/bin"),
		}
		for path, text := range files {
			if err := v.WriteFile(path, []byte(text), 0o644); err != nil {
				return err
			}
		}
		if _, err := v.Run("systemctl daemon-reload && systemctl enable --now crio"); err != nil {
			return err
		}
		if err := n.waitInVM("CRI-O's CRI service", n.guestCrictl()+" version"); err != nil {
			return err
		}
	default:
		config := g.at("containerd/config.toml")
		files := map[string]string{
			config: containerdConfig(g, n.rt.socket(), guestRunc, guestCNI, n.cfg.TestImageName, true),
			// containerd's own unit keeps the shims when it stops (KillMode=process).
			"/etc/systemd/system/containerd.service": unit("containerd", "", guestShared("containerd/containerd")+" --config "+config,
				"KillMode=process", "Environment=PATH="+guestShared("containerd")+":/usr/sbin:/usr/bin:/sbin:/bin"),
		}
		for path, text := range files {
			if err := v.WriteFile(path, []byte(text), 0o644); err != nil {
				return err
			}
		}
		if _, err := v.Run("systemctl daemon-reload && systemctl enable --now containerd"); err != nil {
			return err
		}
		if err := n.waitInVM("containerd's socket", n.guestCtr()+" version"); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) guestCrictl() string {
	return guestShared("containerd/crictl") + " --runtime-endpoint unix://" + n.rt.socket() + " --timeout 300s"
}

func (n *Node) guestCtr() string {
	return guestShared("containerd/ctr") + " --address " + n.rt.socket()
}

// loadImagesInVM loads the images into the guest's runtime (never pulled by the kubelet): the
// test image, the agent's and the examples'.
func (n *Node) loadImagesInVM() error {
	images := [][2]string{{n.cfg.TestImage, n.cfg.TestImageName}, {n.cfg.AgentImage, n.cfg.AgentImageName},
		{n.cfg.ExampleImage, ExampleImage}}
	for _, image := range images {
		archive := shellQuote(guestShared("images/" + filepath.Base(image[0])))
		script := n.guestCtr() + " --namespace k8s.io images import --local " + archive
		if n.cfg.Runtime == CRIO {
			// CRI-O pulls it through its own image service from the directory its default
			// transport (oci-archive:) reads, as on this machine's node (runtime.go).
			name := image[1]
			i := strings.LastIndex(name, ":")
			if i <= 0 {
				return fmt.Errorf("the image name %q has no tag", name)
			}
			link := filepath.Join(guestLayout.at("crio/images"), name[:i])
			script = fmt.Sprintf("mkdir -p %s && ln -sfn %s %s && %s pull %s", shellQuote(filepath.Dir(link)),
				archive, shellQuote(link), n.guestCrictl(), shellQuote(name))
		}
		if _, err := n.vm.Run(script); err != nil {
			return fmt.Errorf("loading the image %s into %s: %w", image[1], n.rt.daemon(), err)
		}
	}
	return nil
}

// startKubeletInVM writes the kubelet's configuration, credentials and unit into the guest and
// starts it.
func (n *Node) startKubeletInVM() error {
	g := guestLayout
	v := n.vm
	ca, err := readFile(n.pki.CA)
	if err != nil {
		return err
	}
	kubeconfig, err := n.guestKubeconfig("kubelet")
	if err != nil {
		return err
	}
	config := kubeletConfig(g, n.rt.socket(), guestIP, "", ReservedCPUs, g.at("pki/ca.crt"), n.gates, true)
	after := "containerd.service"
	if n.cfg.Runtime == CRIO {
		after = "crio.service"
	}
	files := map[string]string{
		g.at("pki/ca.crt"):          ca,
		g.at("kubelet.kubeconfig"):  kubeconfig,
		g.at("kubelet-config.json"): config,
		"/etc/systemd/system/kubelet.service": unit("kubelet", after, guestShared("kubelet")+" --config="+g.at("kubelet-config.json")+
			" --kubeconfig="+g.at("kubelet.kubeconfig")+" --root-dir="+g.KubeletRoot+" --cert-dir="+g.at("kubelet-pki")+
			" --node-ip="+guestIP+" --hostname-override="+NodeName+" --v=2"),
	}
	for path, text := range files {
		if err := v.WriteFile(path, []byte(text), 0o600); err != nil {
			return err
		}
	}
	_, err = v.Run("mkdir -p " + g.at("pod-logs") + " " + g.at("volume-plugins") + " " + g.at("kubelet-pki") +
		" && systemctl daemon-reload && systemctl enable --now kubelet")
	return err
}

// guestKubeconfig is a kubeconfig for user with the API server's address as the guest
// reaches it, its credentials inline.
func (n *Node) guestKubeconfig(user string) (string, error) {
	cert := n.pki.clients[user]
	var data [3][]byte
	for i, f := range []string{n.pki.CA, cert[0], cert[1]} {
		s, err := readFile(f)
		if err != nil {
			return "", err
		}
		data[i] = []byte(s)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["resmgr"] = &clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:%d", guestAPIHost, n.apiPort), CertificateAuthorityData: data[0]}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: data[1], ClientKeyData: data[2]}
	cfg.Contexts["resmgr"] = &clientcmdapi.Context{Cluster: "resmgr", AuthInfo: user}
	cfg.CurrentContext = "resmgr"
	out, err := clientcmd.Write(*cfg)
	return string(out), err
}

// waitInVM waits until script succeeds in the guest.
func (n *Node) waitInVM(what, script string) error {
	return n.waitFor(what, "qemu", time.Minute*2, func() (bool, error) {
		_, err := n.vm.Run(script)
		return err == nil, err
	})
}

// VM is the guest the node runs in; nil when the node is this machine.
func (n *Node) VM() *VM { return n.vm }

// GuestUnits are the systemd units of the node in the guest: the kubelet and the runtime.
func (n *Node) GuestUnits() []string { return []string{"kubelet", n.rt.daemon()} }

// Diagnostics is what a failure should show besides the run's kept files: on this machine's
// node the end of the agent's newest container logs (kept: agentlogs.go); on a VM node the end
// of the guest's console log, the journal of the kubelet and the runtime, and the agent's
// container logs.
func (n *Node) Diagnostics() string {
	if n.vm == nil {
		return "=== the agent's newest container logs:\n" + agentLogTails(n.AgentLogsDir(), 4, 120)
	}
	var b strings.Builder
	console, err := readFile(n.vm.ConsoleLog())
	if err != nil {
		console = err.Error()
	}
	lines := strings.Split(console, "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	fmt.Fprintf(&b, "=== the VM's console (%s), its end:\n%s\n", n.vm.ConsoleLog(), strings.Join(lines, "\n"))
	for _, u := range n.GuestUnits() {
		fmt.Fprintf(&b, "=== journal of %s:\n%s\n", u, n.vm.Journal(150, u))
	}
	agent, err := n.vm.Run("for f in " + guestLayout.at("pod-logs") + "/" + Namespace + "_*/*/*.log; do echo \"--- $f\"; tail -n 150 \"$f\"; done")
	if err != nil {
		agent = err.Error()
	}
	fmt.Fprintf(&b, "=== the agent's container logs:\n%s\n", agent)
	return b.String()
}

// upInVM brings the cluster up with its node in a VM: the guest boots while the control plane
// starts here, on loopback, in the run's cgroup (and no namespace: qemu's user network reaches
// this machine's loopback only).
func (n *Node) upInVM(cfg VMConfig, o Options, began time.Time) (err error) {
	defer func() {
		// Before the guest goes down with the rest: what it says.
		if err != nil && n.vm != nil {
			err = fmt.Errorf("%w\n%s", err, n.Diagnostics())
		}
	}()
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	n.st.Hierarchies = hs
	if err := n.save(); err != nil {
		return err
	}
	if n.procs, err = makeCgroups(hs, n.st.CgroupRoot); err != nil {
		return err
	}
	for _, d := range []string{"logs", "pki"} {
		if err := os.MkdirAll(n.l.at(d), 0o755); err != nil {
			return err
		}
	}
	n.NodeIP = "127.0.0.1"
	if n.apiPort, err = freePort(); err != nil {
		return err
	}
	if n.vm, err = n.startVM(cfg); err != nil {
		return err
	}
	if err := n.controlPlane(); err != nil {
		return err
	}
	o.Logf("cluster: control plane ready at https://%s:%d after %s", n.NodeIP, n.apiPort, time.Since(began).Round(time.Millisecond))
	if err := n.vm.waitSSH(); err != nil {
		return err
	}
	o.Logf("cluster: the VM node booted after %s (console: %s)", time.Since(began).Round(time.Millisecond), n.vm.ConsoleLog())
	if err := n.startRuntimeInVM(); err != nil {
		return err
	}
	o.Logf("cluster: %s up in the VM after %s", n.rt.daemon(), time.Since(began).Round(time.Millisecond))
	// The images load while the kubelet starts: the guest's CPUs would idle otherwise.
	loaded := make(chan error, 1)
	go func() { loaded <- n.loadImagesInVM() }()
	err = n.startKubeletInVM()
	if loadErr := <-loaded; err == nil {
		err = loadErr
	}
	if err != nil {
		return err
	}
	o.Logf("cluster: the kubelet started and the images loaded after %s", time.Since(began).Round(time.Millisecond))
	if err := n.waitNodeReady(); err != nil {
		return err
	}
	o.Logf("cluster: node %s Ready after %s", NodeName, time.Since(began).Round(time.Millisecond))
	if err := n.InstallAgent(o.AgentValues); err != nil {
		return err
	}
	o.Logf("cluster: resmgr installed and publishing after %s", time.Since(began).Round(time.Millisecond))
	return nil
}

// kubeletProcess is the process whose exit means the kubelet is gone: the kubelet, or the VM
// it runs in.
func (n *Node) kubeletProcess() string {
	if n.vm != nil {
		return "qemu"
	}
	return "kubelet"
}

// kubeletTail is the end of the kubelet's log (a VM node's: its journal).
func (n *Node) kubeletTail(lines int) string {
	if n.vm != nil {
		return n.vm.Journal(lines, "kubelet")
	}
	return n.Tail("kubelet", lines)
}

// readFile is a file's text.
func readFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	return string(data), err
}
