package onenode

// The node as a virtual machine (Options.VM): the kubelet and the container runtime run in a
// qemu guest booted from a Debian image xtask builds (`cargo xtask e2e --stage node-v2`,
// xtask/src/build/vm_image.rs), with systemd as PID 1 and cgroup v2 alone, which the machine
// the tests run on may not offer itself. The control plane stays on this machine, on loopback:
// qemu's user networking gives the guest this machine's loopback as 10.0.2.2 (guestAPIHost),
// and forwards a loopback port of this machine to the guest's sshd, through which the node is
// set up, read and rebooted. Nothing else of the network reaches the guest or leaves it.
//
// The guest's disk is a copy-on-write overlay on the cached image, in the run directory, so a
// reboot keeps what the node wrote (the agent's state directory) and loses only its tmpfs
// (/run, where the CDI specs are), as on a real node; the run's directory is shared read-only
// into the guest at vmShare (9p) with the binaries and images the node runs.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Environment variables of the VM node, set by `cargo xtask e2e --stage node-v2`.
const (
	// EnvVMKernel, EnvVMInitrd and EnvVMImage are the guest's kernel, initramfs and root
	// filesystem image (raw ext4, never written: the run writes to an overlay).
	EnvVMKernel = "RESMGR_VM_KERNEL"
	EnvVMInitrd = "RESMGR_VM_INITRD"
	EnvVMImage  = "RESMGR_VM_IMAGE"
	// EnvVMKey is the private key the image's root accepts over ssh.
	EnvVMKey = "RESMGR_VM_SSH_KEY"
	// EnvVMShare is the directory shared into the guest at vmShare: the runtime's binaries
	// (containerd/, crio/), the kubelet and the image archives (images/).
	EnvVMShare = "RESMGR_VM_SHARE"
	// EnvVMAccel is qemu's accelerator (tcg unless set: the machines this runs on offer no KVM
	// that boots a stock kernel).
	EnvVMAccel = "RESMGR_VM_ACCEL"
)

const (
	// vmShare is where the guest mounts EnvVMShare (the image's /etc/fstab says so).
	vmShare = "/opt/resmgr"
	// guestAPIHost is this machine's loopback as the guest reaches it (qemu's user network).
	guestAPIHost = "10.0.2.2"
	// guestIP is the guest's own address on qemu's user network.
	guestIP = "10.0.2.15"
	// VMCPUs is the guest's CPU count, in two NUMA nodes of VMCPUs/2 each: three, so that each
	// node's shared pool keeps a CPU beside the reserved one and a claimed one.
	VMCPUs = 6
	// vmMemoryMiB is the guest's memory, half in each NUMA node.
	vmMemoryMiB = 4096
	// VMHugepages2M is how many 2 MiB pages the guest's kernel reserves at boot (spread over
	// its NUMA nodes).
	VMHugepages2M = 32
	// vmBootLimit bounds a boot, to sshd answering, under emulation on a loaded machine.
	vmBootLimit = 6 * time.Minute
)

// VMConfig is the guest the node runs in.
type VMConfig struct {
	Kernel, Initrd, Image, Key, Share, Accel string
}

// VMConfigFromEnv reads the VM's configuration; ok is false when none is set (the node runs on
// this machine).
func VMConfigFromEnv() (c VMConfig, ok bool, err error) {
	c = VMConfig{Kernel: os.Getenv(EnvVMKernel), Initrd: os.Getenv(EnvVMInitrd), Image: os.Getenv(EnvVMImage),
		Key: os.Getenv(EnvVMKey), Share: os.Getenv(EnvVMShare), Accel: os.Getenv(EnvVMAccel)}
	if c.Kernel == "" && c.Image == "" {
		return c, false, nil
	}
	var missing []string
	for name, v := range map[string]string{EnvVMKernel: c.Kernel, EnvVMInitrd: c.Initrd, EnvVMImage: c.Image,
		EnvVMKey: c.Key, EnvVMShare: c.Share} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return c, true, fmt.Errorf("%s not set: run this with `cargo xtask e2e --stage node-v2`", strings.Join(missing, ", "))
	}
	if c.Accel == "" {
		c.Accel = "tcg,thread=multi,tb-size=512"
	}
	return c, true, nil
}

// VM is the running guest.
type VM struct {
	cfg     VMConfig
	dir     string
	sshPort int
	n       *Node
}

// ConsoleLog is the path of the guest's serial console log (every boot of the run).
func (v *VM) ConsoleLog() string { return filepath.Join(v.dir, "console.log") }

// startVM starts the guest; VM.waitSSH waits until it has booted.
func (n *Node) startVM(cfg VMConfig) (*VM, error) {
	dir := n.l.at("vm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	overlay := filepath.Join(dir, "disk.qcow2")
	if err := run("qemu-img", "create", "-q", "-f", "qcow2", "-b", cfg.Image, "-F", "raw", overlay); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	v := &VM{cfg: cfg, dir: dir, sshPort: port, n: n}
	half := strconv.Itoa(vmMemoryMiB/2) + "M"
	cpus := VMCPUs / 2
	args := []string{
		"-name", "resmgr-node", "-accel", cfg.Accel, "-cpu", "max", "-smp", strconv.Itoa(VMCPUs),
		"-m", strconv.Itoa(vmMemoryMiB) + "M",
		"-object", "memory-backend-ram,id=m0,size=" + half, "-object", "memory-backend-ram,id=m1,size=" + half,
		"-numa", fmt.Sprintf("node,nodeid=0,cpus=0-%d,memdev=m0", cpus-1),
		"-numa", fmt.Sprintf("node,nodeid=1,cpus=%d-%d,memdev=m1", cpus, VMCPUs-1),
		"-kernel", cfg.Kernel, "-initrd", cfg.Initrd,
		// cgroup v2 alone; hugepages reserved before anything runs, on every boot.
		"-append", "console=ttyS0 root=/dev/vda rw panic=-1 cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 " +
			"hugepagesz=2M hugepages=" + strconv.Itoa(VMHugepages2M),
		"-drive", "file=" + overlay + ",if=virtio,format=qcow2,cache=unsafe",
		"-virtfs", "local,path=" + cfg.Share + ",mount_tag=share,security_model=none,readonly=on",
		"-nic", fmt.Sprintf("user,model=virtio-net-pci,restrict=off,hostfwd=tcp:127.0.0.1:%d-:22", port),
		"-serial", "file:" + v.ConsoleLog(), "-monitor", "none", "-display", "none", "-vga", "none",
		"-nodefaults",
	}
	if _, err := n.spawn("qemu", false, "qemu-system-x86_64", args...); err != nil {
		return nil, err
	}
	return v, nil
}

// waitSSH waits until the guest's sshd runs a command.
func (v *VM) waitSSH() error {
	return v.n.waitFor("the VM's sshd", "qemu", vmBootLimit, func() (bool, error) {
		_, err := v.Run("true")
		return err == nil, err
	})
}

// Run runs a shell command in the guest as root; its standard output.
func (v *VM) Run(script string) (string, error) { return v.RunInput(script, nil) }

// RunInput runs a shell command in the guest with input on its standard input.
func (v *VM) RunInput(script string, input []byte) (string, error) {
	// One connection for every command (a key exchange is seconds of an emulated guest): the
	// first command's ssh stays as the master while commands follow, and exits a minute after
	// the last or when the guest goes.
	cmd := exec.Command("ssh", "-q", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=10",
		"-o", "ControlMaster=auto", "-o", "ControlPath="+filepath.Join(v.dir, "ssh.sock"), "-o", "ControlPersist=60",
		"-i", v.cfg.Key, "-p", strconv.Itoa(v.sshPort), "root@127.0.0.1", script)
	if input != nil {
		cmd.Stdin = bytes.NewReader(input)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("in the VM: %s: %w: %s", firstLine(script), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// WriteFile writes a file in the guest (its directory made first).
func (v *VM) WriteFile(path string, data []byte, mode os.FileMode) error {
	_, err := v.RunInput(fmt.Sprintf("mkdir -p %s && cat > %s && chmod %o %s",
		shellQuote(filepath.Dir(path)), shellQuote(path), mode, shellQuote(path)), data)
	return err
}

// Reboot reboots the guest as an operator would (systemctl reboot: units stopped, disks
// synced) and waits until it answers again; its boot ID changes.
func (v *VM) Reboot() error {
	before, err := v.Run("cat /proc/sys/kernel/random/boot_id")
	if err != nil {
		return err
	}
	// The connection may drop before ssh reports the command's status.
	_, _ = v.Run("systemctl reboot")
	return v.n.waitFor("the VM to come back from its reboot", "qemu", vmBootLimit, func() (bool, error) {
		now, err := v.Run("cat /proc/sys/kernel/random/boot_id")
		if err != nil {
			return false, err
		}
		return now != before, errors.New("still the same boot")
	})
}

// Journal is the guest's journal of the units named, the end of it.
func (v *VM) Journal(lines int, units ...string) string {
	args := ""
	for _, u := range units {
		args += " -u " + shellQuote(u)
	}
	out, err := v.Run(fmt.Sprintf("journalctl --no-pager -o short-monotonic -n %d%s", lines, args))
	if err != nil {
		return fmt.Sprintf("(no journal: %v)", err)
	}
	return out
}

// freePort is a TCP port free on loopback now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
