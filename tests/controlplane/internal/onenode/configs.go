package onenode

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
)

const (
	// serviceCIDR is the Service range; without kube-proxy no Service address is routed, the
	// API server's own (serviceIP) is only in its certificate.
	serviceCIDR = "10.96.0.0/24"
	serviceIP   = "10.96.0.1"
	// podCIDR is the bridge's range inside the run's network namespace (nothing outside it
	// sees it, so every run may use the same).
	podCIDR = "10.88.0.0/16"
	// apiPort is the API server's port on the node's address (a VM node's API server listens
	// on a free port of this machine's loopback instead).
	apiPort = 6443
)

// toml quotes s as a TOML basic string (JSON's escapes are TOML's).
func toml(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// containerdConfig keeps everything under the run directory, as the containerd stage's does
// (tests/src/bin/e2e/containerd.rs), and adds the CRI's CNI: Debian's plugins, the run's
// network configuration, and pod network namespaces under containerd's state directory instead
// of /run/netns.
//
// With systemd (a VM node), runc manages cgroups through systemd (SystemdCgroup), as the
// kubelet's systemd driver requires.
func containerdConfig(l layout, socket, runc, cniBin, sandboxImage string, systemd bool) string {
	return fmt.Sprintf(`# containerd of one resmgr cluster: everything lives under its run directory.
version = 3
root = %[1]s
state = %[2]s
temp = %[3]s
imports = []
disabled_plugins = [
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.mount-handler.v1.erofs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = %[4]s

[ttrpc]
  address = %[5]s

[plugins.'io.containerd.internal.v1.opt']
  path = %[6]s

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = %[7]s

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = %[8]s
  plugin_path = %[9]s
  plugin_config_path = %[10]s

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %[11]s

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = [%[12]s]
  # Without CAP_SYS_RESOURCE runc cannot lower a container's oom_score_adj below containerd's.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # The default (true) drops every hugepage limit, the kubelet's and the agent's (NRI) alike.
  disable_hugetlb_controller = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  conf_dir = %[13]s
  bin_dirs = [%[14]s]

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = %[15]s
  Root = %[16]s
  SystemdCgroup = %[17]t

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, toml(l.at("containerd/root")), toml(l.at("containerd/state")), toml(l.at("containerd/tmp")),
		toml(socket), toml(l.at("containerd/containerd.sock.ttrpc")), toml(l.at("containerd/opt")),
		toml(l.at("s")), toml(l.at("nri/nri.sock")), toml(l.at("nri/plugins")), toml(l.at("nri/conf.d")),
		toml(sandboxImage), toml(l.CDIDir), toml(l.at("cni/net.d")), toml(cniBin), toml(runc),
		toml(l.at("containerd/runc")), systemd)
}

// crioConfig is the main configuration of the run's CRI-O, everything under the run directory
// as with the CRI-O stage's (tests/src/bin/e2e/crio.rs), and the CRI's CNI as containerd's
// above: the cgroupfs manager with conmon in the pod's cgroup (the kubelet takes the driver from
// CRI-O), runc behind the run's wrapper (runcWrapper), CDI specs from the agent's directory, the
// test image as the pause image of the pods that need an infra container (drop_infra_ctr stays
// at its default, true: only pods sharing a PID namespace get one), images from the run's
// directory of archives (the default transport; nothing is pulled from a registry), and NRI off:
// the drop-in docs/deploy.md gives operators, written next to this file, turns it on.
//
// With systemd (a VM node), CRI-O manages cgroups through systemd (cgroup_manager), conmon in
// the pod's slice.
func crioConfig(l layout, socket, runc, conmon, crioDir, cniBin, sandboxImage string, systemd bool) string {
	manager := "cgroupfs"
	if systemd {
		manager = "systemd"
	}
	return fmt.Sprintf(`# CRI-O of one resmgr cluster: everything lives under its run directory.
[crio]
root = %[1]s
runroot = %[2]s
storage_driver = "overlay"
log_dir = %[3]s
version_file = %[4]s
version_file_persist = %[5]s
clean_shutdown_file = %[6]s

[crio.api]
listen = %[7]s
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = %[27]s
pinns_path = %[8]s
namespaces_dir = %[9]s
container_exits_dir = %[10]s
container_attach_socket_dir = %[11]s
cdi_spec_dirs = [%[12]s]
hooks_dir = []
decryption_keys_path = %[13]s
selinux = false
irqbalance_config_file = %[14]s
irqbalance_config_restore_file = %[15]s

[crio.runtime.runtimes.runc]
runtime_path = %[16]s
runtime_type = "oci"
runtime_root = %[17]s
monitor_path = %[18]s
monitor_cgroup = "pod"

[crio.image]
default_transport = %[19]s
pause_image = %[20]s
pause_command = ""
signature_policy = %[21]s
big_files_temporary_dir = %[22]s

[crio.network]
network_dir = %[23]s
plugin_dirs = [%[24]s]

[crio.metrics]
enable_metrics = false

[crio.nri]
# Off here: the drop-in docs/deploy.md gives operators turns it on.
enable_nri = false
nri_plugin_dir = %[25]s
nri_plugin_config_dir = %[26]s
`, toml(l.at("crio/root")), toml(l.at("crio/run")), toml(l.at("crio/pod-logs")), toml(l.at("crio/version")),
		toml(l.at("crio/version-persist")), toml(l.at("crio/clean.shutdown")), toml(socket),
		toml(filepath.Join(crioDir, "pinns")), toml(l.at("crio/ns")), toml(l.at("crio/exits")), toml(l.at("crio/attach")),
		toml(l.CDIDir), toml(l.at("crio/keys")), toml(l.at("crio/irqbalance")), toml(l.at("crio/orig_irq_banned_cpus")),
		toml(runc), toml(l.at("crio/runc-state")), toml(conmon), toml("oci-archive:"+l.at("crio/images")+"/"),
		toml(sandboxImage), toml(l.at("crio/policy.json")), toml(l.at("crio/tmp")), toml(l.at("cni/net.d")), toml(cniBin),
		toml(l.at("nri/plugins")), toml(l.at("nri/conf.d")), toml(manager))
}

// crioNRISocketDropin follows the documented drop-in: the run's NRI socket, in the directory
// the chart mounts into the agent's pod (nri.socketDir), instead of the node's.
func crioNRISocketDropin(l layout) string {
	return "# After the documented drop-in: this run's NRI socket, not the node's.\n[crio.nri]\nnri_listen = " + toml(l.at("nri/nri.sock")) + "\n"
}

// cniConfig is the pods' network: a bridge in the run's network namespace, the node's address
// as seen from the pods being its gateway's neighbour, and a default route so that pods reach
// the API server on the node's address. With masquerade (a VM node, whose API server is on the
// host behind qemu's user network) the pods' traffic leaves with the node's address.
func cniConfig(l layout, masquerade bool) string {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "resmgr-cluster",
		"plugins": []any{map[string]any{
			"type":      "bridge",
			"bridge":    "cni0",
			"isGateway": true,
			"ipMasq":    masquerade,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  []any{[]any{map[string]any{"subnet": podCIDR}}},
				"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
				"dataDir": l.at("cni/ipam"),
			},
		}},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	return string(b)
}

// kubeletConfig is the KubeletConfiguration of the run's kubelet: cgroupfs under the run's own
// cgroup root, no CPU manager (the agent owns cpusets), every port on loopback or the node's
// address, no host tuning the machine's root cannot do, and every directory under the run's.
//
// With systemd (a VM node) it is a node as kubeadm sets one up: the systemd cgroup driver, the
// default cgroup root, and failCgroupV1 at its default (the VM has cgroup v2 alone).
func kubeletConfig(l layout, runtimeSocket, nodeIP, cgroupRoot, reservedCPUs, ca string, gates map[string]bool, systemd bool) string {
	conf := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": ca},
		},
		"authorization":               map[string]any{"mode": "Webhook"},
		"address":                     nodeIP,
		"port":                        10250,
		"readOnlyPort":                0,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 10248,
		"containerRuntimeEndpoint":    "unix://" + runtimeSocket,
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  "/" + cgroupRoot,
		"cpuManagerPolicy":            "none",
		"reservedSystemCPUs":          reservedCPUs,
		"failSwapOn":                  false,
		"failCgroupV1":                false,
		"oomScoreAdj":                 0,
		"makeIPTablesUtilChains":      false,
		"podLogsDir":                  l.at("pod-logs"),
		"volumePluginDir":             l.at("volume-plugins"),
		"resolvConf":                  "/etc/resolv.conf",
		"serializeImagePulls":         false,
		"shutdownGracePeriod":         "0s",
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		// A shared build machine's disk is often fuller than the defaults allow.
		"evictionHard": map[string]string{
			"memory.available":  "100Mi",
			"nodefs.available":  "1%",
			"imagefs.available": "1%",
			"nodefs.inodesFree": "1%",
		},
	}
	if len(gates) > 0 {
		conf["featureGates"] = gates
	}
	if systemd {
		conf["cgroupDriver"] = "systemd"
		delete(conf, "cgroupRoot")
		delete(conf, "failCgroupV1")
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	return string(b)
}

// AgentCPURequest is the agent's CPU request on this node: none. The kubelet reserves CPU 0
// for the system by set (reservedSystemCPUs) and the agent, in a reserved namespace, runs on
// exactly that CPU, whose time no pod is allocated; a request would charge it a second time
// against the allocatable CPUs claims are for. On the smallest node the cluster runs on (two
// CPUs, allocatable 1) the chart's 50m would leave no room for any claim of a whole CPU whose
// pod states it in its requests, README.md's "Try it" included; docs/deploy.md gives the same
// advice for every node whose claims should get every CPU. The chart's default stays for the
// nodes it is sized for; TestTheAgentsCPURequestCountsAgainstAClaimOfEveryCPU shows both.
const AgentCPURequest = "0"

// agentValues are the chart's values for this node: its host paths under the run directory,
// the image loaded into the runtime (never pulled), the kubelet's reserved CPUs, the agent's CPU
// request (AgentCPURequest), and the API server's address, which the pod cannot reach through
// the kubernetes Service without kube-proxy.
func agentValues(l layout, repository, tag, apiHost string, port int, reservedCPUs string) map[string]any {
	return map[string]any{
		"image":     map[string]any{"repository": repository, "tag": tag, "pullPolicy": "Never"},
		"nri":       map[string]any{"socketDir": l.at("nri")},
		"kubelet":   map[string]any{"rootDir": l.KubeletRoot},
		"cdi":       map[string]any{"specDir": l.CDIDir},
		"stateDir":  l.at("agent-state"),
		"resources": map[string]any{"requests": map[string]any{"cpu": AgentCPURequest}},
		"config":    map[string]any{"reserved-cpus": reservedCPUs},
		"extraEnv": []any{
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": apiHost},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": strconv.Itoa(port)},
		},
	}
}
