package onenode

import (
	"encoding/json"
	"strings"
	"testing"
)

// A VM node's runtime and kubelet use the systemd cgroup driver, and its kubelet keeps
// failCgroupV1 at its default; this machine's node keeps cgroupfs under its own cgroup root.
func TestAVMNodeUsesTheSystemdDriverAndThisMachinesCgroupfs(t *testing.T) {
	for _, systemd := range []bool{false, true} {
		containerd := containerdConfig(guestLayout, "/s.sock", "/runc", "/cni", "image:1", systemd)
		if want := "SystemdCgroup = " + map[bool]string{false: "false", true: "true"}[systemd]; !strings.Contains(containerd, want) {
			t.Errorf("systemd=%v: containerd's configuration lacks %q:\n%s", systemd, want, containerd)
		}
		crio := crioConfig(guestLayout, "/s.sock", "/runc", "/conmon", "/crio", "/cni", "image:1", systemd)
		if want := `cgroup_manager = "` + map[bool]string{false: "cgroupfs", true: "systemd"}[systemd] + `"`; !strings.Contains(crio, want) {
			t.Errorf("systemd=%v: CRI-O's configuration lacks %q", systemd, want)
		}
		var kubelet map[string]any
		if err := json.Unmarshal([]byte(kubeletConfig(guestLayout, "/s.sock", guestIP, "resmgr-cluster-x", "0", "/ca", nil, systemd)), &kubelet); err != nil {
			t.Fatal(err)
		}
		_, hasRoot := kubelet["cgroupRoot"]
		_, hasFail := kubelet["failCgroupV1"]
		if systemd {
			if kubelet["cgroupDriver"] != "systemd" || hasRoot || hasFail {
				t.Errorf("a VM node's kubelet has cgroupDriver %v, cgroupRoot %v, failCgroupV1 %v; want systemd and neither of the others",
					kubelet["cgroupDriver"], kubelet["cgroupRoot"], kubelet["failCgroupV1"])
			}
		} else if kubelet["cgroupDriver"] != "cgroupfs" || kubelet["cgroupRoot"] != "/resmgr-cluster-x" || kubelet["failCgroupV1"] != false {
			t.Errorf("this machine's kubelet has cgroupDriver %v, cgroupRoot %v, failCgroupV1 %v", kubelet["cgroupDriver"], kubelet["cgroupRoot"], kubelet["failCgroupV1"])
		}
		var cni map[string]any
		if err := json.Unmarshal([]byte(cniConfig(guestLayout, systemd)), &cni); err != nil {
			t.Fatal(err)
		}
		if masq := cni["plugins"].([]any)[0].(map[string]any)["ipMasq"]; masq != systemd {
			t.Errorf("masquerade %v, want %v", masq, systemd)
		}
	}
}

// The VM's configuration is all or nothing: none set means the node is this machine, part of it
// names what is missing.
func TestVMConfigFromEnvNamesWhatIsMissing(t *testing.T) {
	for _, name := range []string{EnvVMKernel, EnvVMInitrd, EnvVMImage, EnvVMKey, EnvVMShare, EnvVMAccel} {
		t.Setenv(name, "")
	}
	if _, ok, err := VMConfigFromEnv(); ok || err != nil {
		t.Fatalf("nothing set: ok %v, err %v; want no VM and no error", ok, err)
	}
	t.Setenv(EnvVMKernel, "/vmlinuz")
	t.Setenv(EnvVMImage, "/root.img")
	_, ok, err := VMConfigFromEnv()
	if !ok || err == nil || !strings.Contains(err.Error(), EnvVMInitrd) || !strings.Contains(err.Error(), EnvVMKey) || !strings.Contains(err.Error(), EnvVMShare) {
		t.Fatalf("part set: ok %v, err %v; want the missing variables named", ok, err)
	}
	t.Setenv(EnvVMInitrd, "/initrd")
	t.Setenv(EnvVMKey, "/key")
	t.Setenv(EnvVMShare, "/share")
	c, ok, err := VMConfigFromEnv()
	if !ok || err != nil || !strings.HasPrefix(c.Accel, "tcg") {
		t.Fatalf("all set: %+v, ok %v, err %v; want tcg by default", c, ok, err)
	}
}
