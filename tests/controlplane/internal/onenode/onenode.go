// Package onenode runs a real one-node Kubernetes cluster with resmgr installed, for the
// cluster e2e stage and for `cargo xtask cluster up`: etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager and a kubelet from the control-plane build, a container runtime
// (Config.Runtime: containerd and runc from the containerd stage, or CRI-O, conmon and runc from
// the CRI-O stage; runtime.go), pod networking from Debian's CNI plugins, and the agent
// installed with Helm from our chart, its image loaded into the runtime. Nothing of the cluster
// is played by our own code.
//
// The host stays untouched. Every process of the run is in a network namespace of the run's own
// (the API server is reached from the host through a veth pair; this kernel has no dummy
// driver) and, apart from the Go side, in a private mount namespace where /var/lib and /var/log
// are overlays with their writes in the run directory (the kubelet writes
// /var/lib/kubelet/device-plugins and /var/log/containers whatever its flags say) and the three
// sysctls the kubelet sets are files bind-mounted at the values it wants; where the machine's
// cgroup v1 hierarchies lack hugetlb, the namespace mounts it (hugetlb.go), and the run reserves
// a few 2 MiB pages before the kubelet starts, given back by Down. Every process, the
// containers included, is in the run's cgroup root, so taking the run down is: SIGKILL what is
// in it until nothing is, remove its cgroups, its host link (gone with the namespace already)
// and its directory. The run's state file says what it made, so `Down` works from another
// process, after a crash, and for a run whose test binary was killed (the next run takes down
// abandoned ones).
package onenode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Environment variables that `cargo xtask e2e --stage cluster` and `cargo xtask cluster` set.
const (
	EnvControlPlane = "RESMGR_CONTROLPLANE_BIN_DIR"
	// EnvRuntime is the node's container runtime (containerd, crio); containerd when unset.
	EnvRuntime    = "RESMGR_CLUSTER_RUNTIME"
	EnvContainerd = "RESMGR_CLUSTER_CONTAINERD_DIR"
	EnvRunc       = "RESMGR_CLUSTER_RUNC"
	EnvCNI        = "RESMGR_CLUSTER_CNI_DIR"
	EnvHelm       = "RESMGR_CLUSTER_HELM"
	EnvChart      = "RESMGR_CLUSTER_CHART"
	EnvAgentImage = "RESMGR_CLUSTER_AGENT_IMAGE"
	EnvAgentName  = "RESMGR_CLUSTER_AGENT_IMAGE_NAME"
	EnvTestImage  = "RESMGR_CLUSTER_TEST_IMAGE"
	EnvTestName   = "RESMGR_CLUSTER_TEST_IMAGE_NAME"
	// EnvExampleImage is the test image's archive named ExampleImage.
	EnvExampleImage = "RESMGR_CLUSTER_EXAMPLE_IMAGE"
	// EnvCrio (crio and pinns), EnvConmon and EnvDeployDoc (docs/deploy.md, whose CRI-O drop-in
	// the node's CRI-O uses) are needed with the crio runtime only.
	EnvCrio      = "RESMGR_CLUSTER_CRIO_DIR"
	EnvConmon    = "RESMGR_CLUSTER_CONMON"
	EnvDeployDoc = "RESMGR_CLUSTER_DEPLOY_DOC"
)

const (
	// NodeName is the one node's name.
	NodeName = "node-1"
	// Namespace and Release are the agent's, as docs/deploy.md installs it.
	Namespace = "resmgr-system"
	Release   = "resmgr"
	// ReservedCPUs are the kubelet's reservedSystemCPUs and the agent's reserved-cpus.
	ReservedCPUs = "0"
	// ExampleImage is the image examples/kubernetes runs: the test image under that name
	// (EnvExampleImage).
	ExampleImage = "docker.io/library/busybox:1.37"
	// runPrefix names the run directories (under the system's temporary directory) and cgroups.
	runPrefix = "resmgr-cluster-"
	// WaitLimit bounds each wait for the cluster to come up or react.
	WaitLimit = 3 * time.Minute
)

// Config is where the cluster's programs and images are, and which runtime the node runs.
type Config struct {
	Runtime                                              Runtime
	ControlPlane, Containerd, Runc, CNI, Helm, Chart     string
	AgentImage, AgentImageName, TestImage, TestImageName string
	ExampleImage                                         string
	// CRI-O's: the directory of crio and pinns, conmon, and docs/deploy.md.
	Crio, Conmon, DeployDoc string
}

// ConfigFromEnv reads the configuration, failing with what to do when part of it is missing.
func ConfigFromEnv() (Config, error) {
	c := Config{
		Runtime:      Runtime(os.Getenv(EnvRuntime)),
		ControlPlane: os.Getenv(EnvControlPlane), Containerd: os.Getenv(EnvContainerd),
		Runc: os.Getenv(EnvRunc), CNI: os.Getenv(EnvCNI), Helm: os.Getenv(EnvHelm),
		Chart: os.Getenv(EnvChart), AgentImage: os.Getenv(EnvAgentImage),
		AgentImageName: os.Getenv(EnvAgentName), TestImage: os.Getenv(EnvTestImage),
		TestImageName: os.Getenv(EnvTestName), ExampleImage: os.Getenv(EnvExampleImage),
		Crio: os.Getenv(EnvCrio), Conmon: os.Getenv(EnvConmon), DeployDoc: os.Getenv(EnvDeployDoc),
	}
	if c.Runtime == "" {
		c.Runtime = Containerd
	}
	if _, err := runtimeOf(c.Runtime, layout{}); err != nil {
		return c, fmt.Errorf("%s: %w", EnvRuntime, err)
	}
	required := map[string]string{
		EnvControlPlane: c.ControlPlane, EnvContainerd: c.Containerd, EnvRunc: c.Runc, EnvCNI: c.CNI,
		EnvHelm: c.Helm, EnvChart: c.Chart, EnvAgentImage: c.AgentImage, EnvAgentName: c.AgentImageName,
		EnvTestImage: c.TestImage, EnvTestName: c.TestImageName, EnvExampleImage: c.ExampleImage,
	}
	if c.Runtime == CRIO {
		required[EnvCrio], required[EnvConmon], required[EnvDeployDoc] = c.Crio, c.Conmon, c.DeployDoc
	}
	var missing []string
	for name, value := range required {
		if value == "" {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		return c, fmt.Errorf("%s not set: run this with `cargo xtask e2e --stage cluster` or `cargo xtask cluster up`, which build everything and set them", strings.Join(missing, ", "))
	}
	return c, nil
}

// layout is where a run keeps things.
type layout struct {
	Dir         string
	KubeletRoot string
	CDIDir      string
}

func (l layout) at(name string) string { return filepath.Join(l.Dir, name) }

func layoutOf(dir string) layout {
	return layout{
		Dir:         dir,
		KubeletRoot: filepath.Join(dir, "kubelet"),
		CDIDir:      filepath.Join(dir, "cdi"),
	}
}

// state is what a run made, written to its directory as it goes: enough for Down to take it all
// down from another process.
type state struct {
	// Owner is the process whose run this is; 0 for a cluster that outlives its starter
	// (`cargo xtask cluster up`).
	Owner       int         `json:"owner"`
	Dir         string      `json:"dir"`
	CgroupRoot  string      `json:"cgroupRoot"`
	Hierarchies []hierarchy `json:"hierarchies"`
	Holder      int         `json:"holder"`
	Network     network     `json:"network"`
	// PIDs of the processes started, by name (also found through the cgroup).
	PIDs map[string]int `json:"pids"`
	// Hugetlb is where the run mounted the hugetlb controller inside its namespace (empty: the
	// machine's hierarchies have it, or its kernel lacks it).
	Hugetlb string `json:"hugetlb,omitempty"`
	// Hugepages2M is how many 2 MiB pages the run reserved (also recorded in its directory).
	Hugepages2M int `json:"hugepages2M,omitempty"`
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// Node is a running cluster.
type Node struct {
	cfg    Config
	l      layout
	rt     runtime
	pki    *pki
	detach bool
	procs  string // the daemons' cgroup.procs
	gates  map[string]bool
	// vm is the guest the node runs in (Options.VM); nil: this machine is the node.
	vm *VM
	// apiPort is the API server's port: apiPort, or a VM node's free port on loopback.
	apiPort int
	// stopKeepingLogs ends keepAgentLogs; nil when it does not run (a VM node).
	stopKeepingLogs chan struct{}

	mu    sync.Mutex
	st    state
	cmds  map[string]*exec.Cmd
	exits map[string]chan error

	// Kubeconfig is an admin kubeconfig for the cluster (client certificate in system:masters).
	Kubeconfig string
	// Client is an admin client.
	Client kubernetes.Interface
	// RESTConfig is Client's configuration.
	RESTConfig *rest.Config
	// NodeIP is the node's address, where the API server listens (port 6443).
	NodeIP string
}

// Options of Up.
type Options struct {
	// Detach leaves the cluster running after this process exits (`cluster up`); otherwise
	// its processes die with it and the next run takes down what is left.
	Detach bool
	// Dir is the run directory; empty: a new one under the system's temporary directory.
	Dir string
	// Logf reports progress.
	Logf func(format string, args ...any)
	// AgentValues are extra chart values, merged over the node's.
	AgentValues map[string]any
	// FeatureGates are given to kube-apiserver, kube-scheduler, kube-controller-manager and
	// the kubelet.
	FeatureGates map[string]bool
	// VM, when set, makes the node a VM (vm.go): the control plane runs here on loopback, the
	// runtime and the kubelet in the guest with the systemd cgroup driver.
	VM *VMConfig
}

// Up starts the cluster and installs the agent. On failure everything started is taken down
// again unless keep says otherwise (the directory is kept for its logs either way).
func Up(cfg Config, o Options) (n *Node, err error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	RemoveAbandoned(o.Logf)
	idBytes := make([]byte, 6)
	if _, err := rand.Read(idBytes); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(idBytes)
	dir := o.Dir
	if dir == "" {
		dir = filepath.Join(os.TempDir(), runPrefix+id)
	}
	if len(filepath.Join(dir, "s")) > 42 {
		return nil, fmt.Errorf("the run directory %s is too long for containerd's shim sockets", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	rt, err := runtimeOf(cfg.Runtime, layoutOf(dir))
	if err != nil {
		return nil, err
	}
	n = &Node{cfg: cfg, l: layoutOf(dir), rt: rt, detach: o.Detach, gates: o.FeatureGates, apiPort: apiPort, cmds: map[string]*exec.Cmd{}, exits: map[string]chan error{}}
	if o.VM != nil {
		// The runtime's sockets are the guest's.
		n.rt, _ = runtimeOf(cfg.Runtime, guestLayout)
	}
	n.st = state{Dir: dir, CgroupRoot: runPrefix + id, PIDs: map[string]int{}}
	if !o.Detach {
		n.st.Owner = os.Getpid()
	}
	defer func() {
		if err != nil {
			if downErr := Down(dir, true); downErr != nil {
				err = errors.Join(err, downErr)
			}
			err = fmt.Errorf("%w\n(the run's files and logs are kept in %s)", err, dir)
		}
	}()
	began := time.Now()
	if o.VM != nil {
		return n, n.upInVM(*o.VM, o, began)
	}
	if err := n.host(); err != nil {
		return n, err
	}
	n.stopKeepingLogs = make(chan struct{})
	go n.keepAgentLogs(n.stopKeepingLogs)
	o.Logf("cluster: namespaces, cgroups and the veth pair ready (node %s)", n.NodeIP)
	if err := n.controlPlane(); err != nil {
		return n, err
	}
	o.Logf("cluster: control plane ready at https://%s:%d after %s", n.NodeIP, n.apiPort, time.Since(began).Round(time.Millisecond))
	if err := n.writeCNIConfig(); err != nil {
		return n, err
	}
	if err := n.rt.start(n); err != nil {
		return n, err
	}
	// The examples (examples/kubernetes) name busybox from Docker Hub, which the node cannot
	// pull: the test image, busybox too, stands in for it under that name.
	for _, image := range [][2]string{{cfg.TestImage, cfg.TestImageName}, {cfg.AgentImage, cfg.AgentImageName},
		{cfg.ExampleImage, ExampleImage}} {
		if err := n.rt.load(n, image[0], image[1]); err != nil {
			return n, fmt.Errorf("loading the image %s into %s: %w", image[1], n.rt.daemon(), err)
		}
	}
	o.Logf("cluster: %s up with the test image, the agent's and the examples' after %s", n.rt.daemon(), time.Since(began).Round(time.Millisecond))
	if err := n.startKubelet(); err != nil {
		return n, err
	}
	if err := n.waitNodeReady(); err != nil {
		return n, err
	}
	o.Logf("cluster: node %s Ready after %s", NodeName, time.Since(began).Round(time.Millisecond))
	if err := n.InstallAgent(o.AgentValues); err != nil {
		return n, err
	}
	o.Logf("cluster: resmgr installed and publishing after %s", time.Since(began).Round(time.Millisecond))
	return n, nil
}

// Dir is the run directory.
func (n *Node) Dir() string { return n.l.Dir }

// Runtime is the node's container runtime.
func (n *Node) Runtime() Runtime { return n.cfg.Runtime }

// Chart is the chart's directory.
func (n *Node) Chart() string { return n.cfg.Chart }

// CDIDir is where the agent writes its CDI specs.
func (n *Node) CDIDir() string { return n.l.CDIDir }

// KubeletRoot is the kubelet's --root-dir.
func (n *Node) KubeletRoot() string { return n.l.KubeletRoot }

// Log is the path of a process's log (RuntimeDaemon: the runtime's).
func (n *Node) Log(name string) string { return n.l.at("logs/" + n.daemon(name) + ".log") }

// daemon resolves RuntimeDaemon to the runtime's process name.
func (n *Node) daemon(name string) string {
	if name == RuntimeDaemon {
		return n.rt.daemon()
	}
	return name
}

func (n *Node) save() error {
	n.mu.Lock()
	data, err := json.MarshalIndent(n.st, "", "  ")
	n.mu.Unlock()
	if err != nil {
		return err
	}
	tmp := statePath(n.l.Dir) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(n.l.Dir))
}

// host makes the run's cgroups, namespaces, mounts and link.
func (n *Node) host() error {
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
	if n.st.Network, err = pickNetwork(strings.TrimPrefix(n.st.CgroupRoot, runPrefix)); err != nil {
		return err
	}
	n.NodeIP = n.st.Network.NodeIP
	for _, d := range []string{"logs", "pki", "ovl/varlib/upper", "ovl/varlib/work", "ovl/varlog/upper",
		"ovl/varlog/work", "sysctl", "containerd", "nri/plugins", "nri/conf.d", "cni/net.d", "cni/ipam",
		"cdi", "kubelet", "kubelet-pki", "pod-logs", "volume-plugins", "flexvolume", "agent-state"} {
		if err := os.MkdirAll(n.l.at(d), 0o755); err != nil {
			return err
		}
	}
	// The namespace holder: a process whose only job is to keep the namespaces alive.
	holder, err := n.spawn("holder", false, "unshare", "--mount", "--propagation", "slave", "--net", "--", "sleep", "infinity")
	if err != nil {
		return err
	}
	n.st.Holder = holder
	if err := n.save(); err != nil {
		return err
	}
	ours, _ := os.Readlink("/proc/self/ns/net")
	deadline := time.Now().Add(10 * time.Second)
	for {
		theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", holder))
		if theirs != "" && theirs != ours {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the namespace holder did not enter its namespaces in 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if hugetlbNeeded(hs) {
		if err := n.mountHugetlb(hs); err != nil {
			return err
		}
	}
	// Before the kubelet starts: it reads the node's hugepages once, for its capacity.
	if n.st.Hugepages2M, err = reserveHugepages(NRHugepages2M, n.l.Dir, ReservedHugepages); err != nil {
		return err
	}
	if err := n.save(); err != nil {
		return err
	}
	sysctls := map[string]string{"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
	steps := [][]string{
		{"mount", "--make-rshared", "/"},
		{"mount", "-t", "overlay", "overlay", "-o", "lowerdir=/var/lib,upperdir=" + n.l.at("ovl/varlib/upper") + ",workdir=" + n.l.at("ovl/varlib/work"), "/var/lib"},
		{"mount", "-t", "overlay", "overlay", "-o", "lowerdir=/var/log,upperdir=" + n.l.at("ovl/varlog/upper") + ",workdir=" + n.l.at("ovl/varlog/work"), "/var/log"},
	}
	for key, value := range sysctls {
		file := n.l.at("sysctl/" + strings.ReplaceAll(key, "/", "."))
		if err := os.WriteFile(file, []byte(value+"\n"), 0o644); err != nil {
			return err
		}
		steps = append(steps, []string{"mount", "--bind", file, "/proc/sys/" + key})
	}
	net := n.st.Network
	steps = append(steps, []string{"ip", "link", "set", "lo", "up"})
	if err := run("ip", "link", "add", net.HostLink, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(holder)); err != nil {
		return err
	}
	if err := n.save(); err != nil {
		return err
	}
	if err := run("ip", "addr", "add", net.HostIP+"/30", "dev", net.HostLink); err != nil {
		return err
	}
	if err := run("ip", "link", "set", net.HostLink, "up"); err != nil {
		return err
	}
	steps = append(steps,
		[]string{"ip", "addr", "add", net.NodeIP + "/30", "dev", "eth0"},
		[]string{"ip", "link", "set", "eth0", "up"},
		[]string{"ip", "route", "add", "default", "via", net.HostIP})
	for _, s := range steps {
		if err := inNamespaces(holder, s...); err != nil {
			return err
		}
	}
	return nil
}

// spawn starts a program in the run's cgroup (and with inNS, in its namespaces), logging to
// logs/<name>.log, and records its PID.
func (n *Node) spawn(name string, inNS bool, program string, args ...string) (int, error) {
	out, err := os.OpenFile(n.Log(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	// The shell joins the cgroup before anything runs, so that nothing the program starts
	// escapes it, and then becomes the program.
	script := `echo $$ > "$0" && exec "$@"`
	full := []string{"-c", script, n.procs}
	if inNS && n.st.Holder != 0 {
		full = append(full, "nsenter", "--target", strconv.Itoa(n.st.Holder), "--mount", "--net", "--")
	}
	full = append(full, program)
	full = append(full, args...)
	cmd := exec.Command("/bin/sh", full...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = out, out, n.l.Dir
	if n.detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", name, err)
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	n.mu.Lock()
	n.cmds[name], n.exits[name] = cmd, exit
	n.st.PIDs[name] = cmd.Process.Pid
	n.mu.Unlock()
	return cmd.Process.Pid, n.save()
}

// Start starts one of the cluster's daemons again after Stop: the kubelet, or the runtime
// (RuntimeDaemon, or its own name).
func (n *Node) Start(name string) error {
	switch n.daemon(name) {
	case "kubelet":
		return n.startKubelet()
	case n.rt.daemon():
		return n.rt.start(n)
	}
	return fmt.Errorf("no daemon %q to start", name)
}

// Stop stops a daemon with SIGTERM (SIGKILL after 20 s) and waits for it to exit; RuntimeDaemon
// is the runtime's.
func (n *Node) Stop(name string) error {
	name = n.daemon(name)
	n.mu.Lock()
	cmd, exit := n.cmds[name], n.exits[name]
	n.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s is not running", name)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exit:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exit
	}
	n.mu.Lock()
	delete(n.cmds, name)
	delete(n.st.PIDs, name)
	n.mu.Unlock()
	return n.save()
}

// Running says whether a daemon started by this process is still running.
func (n *Node) Running(name string) bool {
	name = n.daemon(name)
	n.mu.Lock()
	exit := n.exits[name]
	_, started := n.cmds[name]
	n.mu.Unlock()
	if !started {
		return false
	}
	select {
	case err := <-exit:
		exit <- err
		return false
	default:
		return true
	}
}

// Tail is the end of a process's log.
func (n *Node) Tail(name string, lines int) string {
	data, err := os.ReadFile(n.Log(name))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// waitFor polls ready every 100 ms until it is true, name's process exits, or limit passes.
func (n *Node) waitFor(what, name string, limit time.Duration, ready func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		ok, err := ready()
		if ok {
			return nil
		}
		last = err
		if name != "" && !n.Running(name) {
			return fmt.Errorf("%s exited while waiting for %s; its log ends:\n%s", name, what, n.Tail(name, 30))
		}
		if time.Now().After(deadline) {
			tail := ""
			if name != "" {
				tail = "; the log of " + name + " ends:\n" + n.Tail(name, 30)
			}
			return fmt.Errorf("%s not after %s (last: %v)%s", what, limit, last, tail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *Node) kubeconfig(name string, user string) (string, error) {
	cert := n.pki.clients[user]
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["resmgr"] = &clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:%d", n.NodeIP, n.apiPort), CertificateAuthority: n.pki.CA}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: cert[0], ClientKey: cert[1]}
	cfg.Contexts["resmgr"] = &clientcmdapi.Context{Cluster: "resmgr", AuthInfo: user}
	cfg.CurrentContext = "resmgr"
	path := n.l.at(name)
	return path, clientcmd.WriteToFile(*cfg, path)
}

func (n *Node) controlPlane() error {
	var err error
	// A VM node reaches the API server at guestAPIHost, which its certificate must name.
	certIP, advertise := n.NodeIP, n.NodeIP
	if n.vm != nil {
		certIP, advertise = guestAPIHost, guestAPIHost
	}
	if n.pki, err = makePKI(n.l.at("pki"), NodeName, certIP); err != nil {
		return err
	}
	if n.Kubeconfig, err = n.kubeconfig("kubeconfig", "admin"); err != nil {
		return err
	}
	for _, c := range []string{"scheduler", "controller-manager", "kubelet"} {
		if _, err := n.kubeconfig(c+".kubeconfig", c); err != nil {
			return err
		}
	}
	admin := n.pki.clients["admin"]
	n.RESTConfig = &rest.Config{Host: fmt.Sprintf("https://%s:%d", n.NodeIP, n.apiPort), QPS: 200, Burst: 400, Timeout: 30 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{CAFile: n.pki.CA, CertFile: admin[0], KeyFile: admin[1]}}
	if n.Client, err = kubernetes.NewForConfig(n.RESTConfig); err != nil {
		return err
	}
	bin := func(name string) string { return filepath.Join(n.cfg.ControlPlane, name) }
	// In the run's network namespace etcd has loopback to itself; a VM node's control plane
	// shares this machine's, so it takes free ports.
	clientPort, peerPort := 2379, 2380
	if n.vm != nil {
		if clientPort, err = freePort(); err != nil {
			return err
		}
		if peerPort, err = freePort(); err != nil {
			return err
		}
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	if _, err := n.spawn("etcd", true, bin("etcd"), "--name=node", "--data-dir="+n.l.at("etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=node="+peerURL, "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	p := n.pki
	var gates []string
	if len(n.gates) > 0 {
		gates = []string{"--feature-gates=" + gateFlag(n.gates)}
	}
	if _, err := n.spawn("kube-apiserver", true, bin("kube-apiserver"), append(gates,
		"--etcd-servers="+etcdURL,
		"--bind-address="+n.NodeIP, "--advertise-address="+advertise, "--secure-port="+strconv.Itoa(n.apiPort),
		"--cert-dir="+n.l.at("pki/apiserver"),
		"--tls-cert-file="+p.Serving, "--tls-private-key-file="+p.ServingKey,
		"--client-ca-file="+p.CA,
		"--kubelet-client-certificate="+p.KubeletClient, "--kubelet-client-key="+p.KubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+p.ServiceAccountPub,
		"--service-account-signing-key-file="+p.ServiceAccountKey,
		"--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false")...); err != nil {
		return err
	}
	err = n.waitFor("the API server to be ready", "kube-apiserver", WaitLimit, func() (bool, error) {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		body, err := n.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(cx)
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, body)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	if _, err := n.spawn("kube-scheduler", true, bin("kube-scheduler"), append(gates,
		"--kubeconfig="+n.l.at("scheduler.kubeconfig"), "--leader-elect=false", "--secure-port=0")...); err != nil {
		return err
	}
	// Every controller (the DRA ones: resourceclaim, garbage-collector, serviceaccount,
	// root-ca-certificate-publisher, node-lifecycle, daemonset), the flex volume directory
	// under the run's (it creates it otherwise under /usr/libexec).
	_, err = n.spawn("kube-controller-manager", true, bin("kube-controller-manager"), append(gates,
		"--kubeconfig="+n.l.at("controller-manager.kubeconfig"), "--leader-elect=false", "--secure-port=0",
		"--controllers=*", "--flex-volume-plugin-dir="+n.l.at("flexvolume"),
		"--service-account-private-key-file="+p.ServiceAccountKey, "--root-ca-file="+p.CA,
		"--cluster-signing-cert-file="+p.CA, "--cluster-signing-key-file="+p.CAKey,
		"--use-service-account-credentials=true")...)
	return err
}

// gateFlag is the value of --feature-gates, in a stable order.
func gateFlag(gates map[string]bool) string {
	var parts []string
	for name, on := range gates {
		parts = append(parts, name+"="+strconv.FormatBool(on))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// writeCNIConfig writes the pods' network configuration, which either runtime reads.
func (n *Node) writeCNIConfig() error {
	return os.WriteFile(n.l.at("cni/net.d/10-resmgr-cluster.conflist"), []byte(cniConfig(n.l, false)), 0o644)
}

func (n *Node) startKubelet() error {
	config := n.l.at("kubelet-config.json")
	if err := os.WriteFile(config, []byte(kubeletConfig(n.l, n.rt.socket(), n.NodeIP, n.st.CgroupRoot, ReservedCPUs, n.pki.CA, n.gates, false)), 0o644); err != nil {
		return err
	}
	_, err := n.spawn("kubelet", true, filepath.Join(n.cfg.ControlPlane, "kubelet"),
		"--config="+config, "--kubeconfig="+n.l.at("kubelet.kubeconfig"),
		"--root-dir="+n.l.KubeletRoot, "--cert-dir="+n.l.at("kubelet-pki"),
		"--node-ip="+n.NodeIP, "--hostname-override="+NodeName, "--v=2")
	return err
}

func (n *Node) waitNodeReady() error {
	return n.waitFor("node "+NodeName+" to be Ready", n.kubeletProcess(), WaitLimit, func() (bool, error) {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		node, err := n.Client.CoreV1().Nodes().Get(cx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("Ready=%s: %s", c.Status, c.Message)
			}
		}
		return false, errors.New("no Ready condition")
	})
}

// Kubectl runs the built kubectl against the cluster as the admin; its standard output.
func (n *Node) Kubectl(args ...string) (string, error) {
	return n.tool(filepath.Join(n.cfg.ControlPlane, "kubectl"), args...)
}

// Helm runs helm against the cluster as the admin; its standard output.
func (n *Node) Helm(args ...string) (string, error) {
	return n.tool(n.cfg.Helm, args...)
}

func (n *Node) tool(program string, args ...string) (string, error) {
	cmd := exec.Command(program, append([]string{"--kubeconfig=" + n.Kubeconfig}, args...)...)
	// helm keeps its caches and configuration under the run, never in the user's home.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+n.l.at("helm/cache"),
		"HELM_CONFIG_HOME="+n.l.at("helm/config"), "HELM_DATA_HOME="+n.l.at("helm/data"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s%s", filepath.Base(program), strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out), nil
}

// ValuesFile writes the node's chart values, with extra merged over them, to a file; its path.
func (n *Node) ValuesFile(name string, extra map[string]any) (string, error) {
	repository, tag, ok := strings.Cut(n.cfg.AgentImageName, ":")
	if i := strings.LastIndex(n.cfg.AgentImageName, ":"); i > 0 {
		repository, tag, ok = n.cfg.AgentImageName[:i], n.cfg.AgentImageName[i+1:], true
	}
	if !ok {
		return "", fmt.Errorf("the agent's image %s has no tag", n.cfg.AgentImageName)
	}
	values := merge(agentValues(n.l, repository, tag, n.NodeIP, n.apiPort, ReservedCPUs), extra)
	if n.vm != nil {
		values = merge(agentValues(guestLayout, repository, tag, guestAPIHost, n.apiPort, ReservedCPUs), extra)
	}
	data, err := json.MarshalIndent(values, "", "  ")
	if err != nil {
		return "", err
	}
	path := n.l.at(name)
	return path, os.WriteFile(path, data, 0o644)
}

// merge merges b over a, map by map.
func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		am, aok := out[k].(map[string]any)
		bm, bok := v.(map[string]any)
		if aok && bok {
			out[k] = merge(am, bm)
		} else {
			out[k] = v
		}
	}
	return out
}

// InstallAgent installs the chart as docs/deploy.md says (a namespace labelled privileged for
// Pod Security, then helm install), waits for the DaemonSet's pod to be Ready and for its
// ResourceSlices.
func (n *Node) InstallAgent(extra map[string]any) error {
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := n.Client.CoreV1().Namespaces().Get(cx, Namespace, metav1.GetOptions{})
	cancel()
	if apierrors.IsNotFound(err) {
		_, err = n.Kubectl("create", "namespace", Namespace)
	}
	if err != nil {
		return err
	}
	if _, err := n.Kubectl("label", "namespace", Namespace, "pod-security.kubernetes.io/enforce=privileged"); err != nil {
		return err
	}
	values, err := n.ValuesFile("values.json", extra)
	if err != nil {
		return err
	}
	if _, err := n.Helm("install", Release, n.cfg.Chart, "--namespace", Namespace, "-f", values,
		"--wait", "--timeout", "5m"); err != nil {
		return fmt.Errorf("%w\nkubelet log ends:\n%s", err, n.kubeletTail(20))
	}
	return n.WaitSlices()
}

// WaitSlices waits until the agent has published ResourceSlices for the node.
func (n *Node) WaitSlices() error {
	return n.waitFor("the agent's ResourceSlices", "", WaitLimit, func() (bool, error) {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		slices, err := n.Client.ResourceV1().ResourceSlices().List(cx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + NodeName})
		if err != nil {
			return false, err
		}
		return len(slices.Items) > 0, errors.New("none yet")
	})
}

// Close takes the cluster down (a detached one too).
func (n *Node) Close(keep bool) error {
	if n.stopKeepingLogs != nil {
		close(n.stopKeepingLogs)
		n.stopKeepingLogs = nil
	}
	return Down(n.l.Dir, keep)
}

// Down takes down the run in dir: every process in its cgroup, its cgroups (the hugetlb ones
// too), its hugepages, its host link and, unless keep, its directory.
func Down(dir string, keep bool) error {
	data, err := os.ReadFile(statePath(dir))
	if err != nil {
		return fmt.Errorf("%s: %w (no cluster there?)", statePath(dir), err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("%s: %w", statePath(dir), err)
	}
	var errs []error
	for _, pid := range st.PIDs {
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if st.CgroupRoot != "" && len(st.Hierarchies) > 0 {
		if err := killCgroup(st.Hierarchies, st.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	// After every process of the run has exited: the namespace, and the mount in it, are gone.
	if st.Hugetlb != "" && st.CgroupRoot != "" {
		if _, err := hugetlbCgroups(st.CgroupRoot, false); err != nil {
			errs = append(errs, err)
		}
	}
	if err := releaseHugepages(NRHugepages2M, dir); err != nil {
		errs = append(errs, err)
	}
	if link := st.Network.HostLink; link != "" {
		if _, err := os.Stat("/sys/class/net/" + link); err == nil {
			// The kernel removes the link by itself once the network namespace at its other
			// end is gone, which the kill above starts: it may go between the look and the
			// delete, and then it is gone as wanted.
			if err := run("ip", "link", "del", link); err != nil && hostLinkExists(link) {
				errs = append(errs, err)
			}
		}
	}
	if !keep && len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// hostLinkExists says whether the network link is still there.
func hostLinkExists(link string) bool {
	_, err := os.Stat("/sys/class/net/" + link)
	return err == nil
}

// RemoveAbandoned takes down the runs whose owner has died (a test binary killed on a timeout).
func RemoveAbandoned(logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), runPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(statePath(dir))
		if err != nil {
			continue
		}
		var st state
		if json.Unmarshal(data, &st) != nil || st.Owner == 0 || alive(st.Owner) {
			continue
		}
		logf("cluster: taking down %s, abandoned by process %d", dir, st.Owner)
		if err := Down(dir, false); err != nil {
			logf("cluster: %v", err)
		}
	}
}

// Leftovers lists what of the run is still on the machine after Close: its directory, cgroups,
// mounts, hugepages, host link and processes. Empty once the run is fully down.
func (n *Node) Leftovers() []string {
	var left []string
	if _, err := os.Stat(n.l.Dir); err == nil {
		left = append(left, "directory "+n.l.Dir)
	}
	for _, h := range n.st.Hierarchies {
		if _, err := os.Stat(filepath.Join(h.Mount, n.st.CgroupRoot)); err == nil {
			left = append(left, "cgroup "+filepath.Join(h.Mount, n.st.CgroupRoot))
		}
	}
	if n.st.Hugetlb != "" {
		out, err := hugetlbCgroups(n.st.CgroupRoot, true)
		if err != nil {
			left = append(left, err.Error())
		} else if out != "" {
			left = append(left, out)
		}
	}
	if _, err := os.Stat(filepath.Join(n.l.Dir, hugepageRecord)); err == nil {
		left = append(left, fmt.Sprintf("%d hugepages of 2 MiB, not given back (%s)", n.st.Hugepages2M, filepath.Join(n.l.Dir, hugepageRecord)))
	}
	if mounts, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], n.l.Dir) {
				left = append(left, "mount "+f[1])
			}
		}
	}
	if link := n.st.Network.HostLink; link != "" && hostLinkExists(link) {
		left = append(left, "link "+link)
	}
	for name, pid := range n.st.PIDs {
		if alive(pid) {
			left = append(left, fmt.Sprintf("process %s (%d)", name, pid))
		}
	}
	return left
}
