package scale

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
)

// What `cargo xtask bench --scale` sets.
const (
	// envBinDir holds `resmgr`.
	envBinDir = "RESMGR_BIN_DIR"
	// envNodes lists the cluster sizes, "100,500"; "0" runs only the filling-up phases.
	envNodes = "RESMGR_SCALE_NODES"
	// envPods is the most pods per phase; a phase takes fewer when its nodes hold fewer (see
	// podsFor).
	envPods = "RESMGR_SCALE_PODS"
	// envRounds is how many times every (nodes, model) phase runs.
	envRounds = "RESMGR_SCALE_ROUNDS"
	// envModels lists the models to run (all when unset).
	envModels = "RESMGR_SCALE_MODELS"
	// envFillNodes is the cluster size of the filling-up phases (claims for 90 % of all
	// claimable CPUs); 0 runs none.
	envFillNodes = "RESMGR_SCALE_FILL_NODES"
	// envProfile, when set, is a directory: kube-scheduler serves its profiling endpoint, and
	// each phase saves 30 s of its CPU profile there, taken once pods are being created.
	envProfile = "RESMGR_SCALE_PROFILE"
	// envNodesToScore, when set, is kube-scheduler's percentageOfNodesToScore (default: its
	// own, adaptive).
	envNodesToScore = "RESMGR_SCALE_NODES_TO_SCORE"
)

const (
	driver    = "topology-aware.resmgr.io"
	className = "resmgr-cpu"
	namespace = "scale"
	// The server every node is: 2 sockets, 4 NUMA nodes, 64 cores, 128 threads; 2 reserved.
	topology     = "synthetic:pack:2 numa:2 core:16 pu:2"
	reservedCPUs = 2
	claimable    = 128 - reservedCPUs
	// CPUs per claim in every model.
	cpusPerClaim = 4
	// Pods per node when M is not given: upstream scheduler_perf's 5,000 pods on 500 nodes.
	podsPerNode = 10
	numaNode    = "resource.kubernetes.io/numaNode"
	// How long a phase may go without a pod being bound before it gives up.
	stallLimit = 2 * time.Minute
)

// A device model: the agent's settings and the claim a pod makes of it, for 4 CPUs.
type model struct {
	name  string
	flags []string
	// devices per claim, and the capacity each consumes (grouped only).
	count    int64
	capacity string
	// matchAttribute on the NUMA node.
	sameNUMA bool
}

var models = []model{
	{name: "grouped", flags: []string{"--device-mode", "grouped"}, count: 1, capacity: "4"},
	{name: "individual-numa", flags: []string{"--device-mode", "individual"}, count: 4, sameNUMA: true},
	{name: "individual-cores", flags: []string{"--device-mode", "individual", "--claim-granularity", "core"}, count: 2, sameNUMA: true},
	{name: "individual", flags: []string{"--device-mode", "individual"}, count: 4},
}

func (m model) claim(name string) *resourcev1.ResourceClaim {
	req := resourcev1.ExactDeviceRequest{
		DeviceClassName: className,
		AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
		Count:           m.count,
	}
	if m.capacity != "" {
		req.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
			"cpu": resource.MustParse(m.capacity)}}
	}
	spec := resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "cpus", Exactly: &req}}}
	if m.sameNUMA {
		attr := resourcev1.FullyQualifiedName(numaNode)
		spec.Constraints = []resourcev1.DeviceConstraint{{Requests: []string{"cpus"}, MatchAttribute: &attr}}
	}
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       resourcev1.ResourceClaimSpec{Devices: spec},
	}
}

func pod(name, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "cpus"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "cpus", ResourceClaimName: &claim}},
		},
	}
}

// result is one phase's measurements, printed as a `scale:` line.
type result struct {
	Nodes         int     `json:"nodes"`
	Model         string  `json:"model"`
	Fill          bool    `json:"fill"`
	Round         int     `json:"round"`
	Pods          int     `json:"pods"`
	Bound         int     `json:"bound"`
	CreatedPerSec float64 `json:"created_per_s"`
	PodsPerSec    float64 `json:"pods_per_s"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	SchedCPUSec   float64 `json:"scheduler_cpu_s"`
	// Attempts are the scheduling attempts for the phase's pods (scheduled, unschedulable and
	// error), Unschedulable those that found no node.
	Attempts       int    `json:"attempts"`
	Unschedulable  int    `json:"unschedulable_attempts"`
	SchedPeakRSS   int64  `json:"scheduler_peak_rss_bytes"`
	APIServerRSS   int64  `json:"apiserver_rss_bytes"`
	APIServerPeak  int64  `json:"apiserver_peak_rss_bytes"`
	Slices         int    `json:"slices"`
	SliceBytes     int    `json:"slice_bytes"`
	DevicesPerNode int    `json:"devices_per_node"`
	Load           string `json:"load"`
}

func BenchmarkScale(b *testing.B) {
	nodes := intList(b, envNodes, "100,500")
	maxPods := intList(b, envPods, "5000")[0]
	rounds := intList(b, envRounds, "1")[0]
	fillNodes := intList(b, envFillNodes, "100")[0]
	chosen := models
	if names := os.Getenv(envModels); names != "" {
		chosen = nil
		for _, name := range strings.Split(names, ",") {
			found := false
			for _, m := range models {
				if m.name == name {
					chosen, found = append(chosen, m), true
				}
			}
			if !found {
				b.Fatalf("%s: no model %q", envModels, name)
			}
		}
	}
	resmgr := filepath.Join(os.Getenv(envBinDir), "resmgr")
	if _, err := os.Stat(resmgr); err != nil {
		b.Fatalf("%s: the resmgr binary is needed: %v", envBinDir, err)
	}
	for round := 1; round <= rounds; round++ {
		// Alternate: each round starts with the next model.
		order := append(append([]model{}, chosen[(round-1)%len(chosen):]...), chosen[:(round-1)%len(chosen)]...)
		for _, n := range nodes {
			if n == 0 {
				continue
			}
			for _, m := range order {
				pods := podsFor(n, maxPods, false)
				b.Run(fmt.Sprintf("nodes=%d/%s/round=%d", n, m.name, round), func(b *testing.B) {
					phase(b, resmgr, n, pods, m, false, round)
				})
			}
		}
		if fillNodes > 0 {
			for _, m := range order {
				pods := podsFor(fillNodes, maxPods, true)
				b.Run(fmt.Sprintf("nodes=%d/%s/fill/round=%d", fillNodes, m.name, round), func(b *testing.B) {
					phase(b, resmgr, fillNodes, pods, m, true, round)
				})
			}
		}
	}
}

// podsFor is M for a phase: claims for 90 % of the claimable CPUs when filling up, else
// podsPerNode per node up to maxPods (5,000 claims of 4 CPUs need 20,000 CPUs, which 100
// nodes of 126 claimable CPUs do not have).
func podsFor(nodes, maxPods int, fill bool) int {
	if fill {
		return nodes * claimable * 9 / 10 / cpusPerClaim
	}
	return min(maxPods, nodes*podsPerNode)
}

func intList(b *testing.B, env, fallback string) []int {
	value := os.Getenv(env)
	if value == "" {
		value = fallback
	}
	var out []int
	for _, part := range strings.Split(value, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 0 {
			b.Fatalf("%s=%q: want numbers separated by commas", env, value)
		}
		out = append(out, n)
	}
	return out
}

func phase(b *testing.B, resmgr string, nodes, pods int, m model, fill bool, round int) {
	// The scheduler's client is limited to 50 requests/s by default, which would cap binding
	// at about 25 pods/s (a bind and a claim status update each); upstream's scheduler_perf
	// runs it without such a limit. Of the controllers only the service account one, for the
	// namespace's default ServiceAccount: the benchmark's pods never run, and the resource
	// claim controller would only add load to the two being measured.
	clientArgs := []string{"--kube-api-qps=5000", "--kube-api-burst=5000"}
	schedulerArgs := []string{"-v=1"}
	profileDir := os.Getenv(envProfile)
	// The scheduler's metrics (its attempts) and profile, served to anyone on loopback: the
	// paths skip authorization, and without an authentication kubeconfig the scheduler takes
	// the request as anonymous.
	port := freePort(b)
	schedulerArgs = append(schedulerArgs, fmt.Sprintf("--secure-port=%d", port),
		"--bind-address=127.0.0.1", "--authorization-always-allow-paths=/metrics,/debug/pprof/profile")
	opts := cluster.Options{SchedulerArgs: append(clientArgs, schedulerArgs...),
		Controllers: []string{cluster.ServiceAccountController}}
	if pct := os.Getenv(envNodesToScore); pct != "" {
		if _, err := strconv.Atoi(pct); err != nil {
			b.Fatalf("%s=%q: want a percentage", envNodesToScore, pct)
		}
		// The configuration file replaces the client flags: the same limits, in it.
		opts.SchedulerArgs = schedulerArgs
		opts.SchedulerConfig = func(kubeconfig string) string {
			return fmt.Sprintf("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"+
				"clientConnection: {kubeconfig: %q, qps: 5000, burst: 5000}\nleaderElection: {leaderElect: false}\n"+
				"percentageOfNodesToScore: %s\n", kubeconfig, pct)
		}
	}
	c := cluster.StartWith(b, opts)
	cfg := rest.CopyConfig(c.AdminConfig)
	cfg.QPS, cfg.Burst = 5000, 5000
	client := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	c.Namespace(namespace)
	cx := context.Background()
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: className},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: `device.driver == "` + driver + `"`}}}}}
	if _, err := client.ResourceV1().DeviceClasses().Create(cx, class, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}

	began := time.Now()
	uids := make([]string, nodes)
	for i := range nodes {
		uids[i] = string(c.Node(nodeName(i), "128", "512Gi").UID)
	}
	devicesPerNode := publish(b, dyn, resmgr, m, uids)
	slices, sliceBytes := stored(b, client)
	b.Logf("%d nodes with %d slices (%d bytes) in %s", nodes, slices, sliceBytes, time.Since(began).Round(time.Millisecond))

	apiPID, schedPID := c.PIDs()
	settle(schedPID)
	cpuBefore := cpuSeconds(b, schedPID)
	attemptsBefore := attempts(b, port)

	var mu sync.Mutex
	boundAt := make(map[string]time.Time, pods)
	done := make(chan struct{})
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	informer := factory.Core().V1().Pods().Informer()
	onPod := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, seen := boundAt[p.Name]; !seen {
			boundAt[p.Name] = time.Now()
			if len(boundAt) == pods {
				close(done)
			}
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPod, UpdateFunc: func(_, obj any) { onPod(obj) }})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	createdAt := make([]time.Time, pods)
	var failed atomic.Int64
	var firstErr atomic.Value
	next := make(chan int)
	var workers sync.WaitGroup
	for range 16 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := range next {
				name := fmt.Sprintf("pod-%05d", i)
				if _, err := client.ResourceV1().ResourceClaims(namespace).Create(cx, m.claim(name), metav1.CreateOptions{}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				createdAt[i] = time.Now()
				if _, err := client.CoreV1().Pods(namespace).Create(cx, pod(name, name), metav1.CreateOptions{}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	start := time.Now()
	profiled := make(chan error, 1)
	if profileDir != "" {
		file := filepath.Join(profileDir, fmt.Sprintf("scheduler-%d-%s-fill=%v-r%d.pprof", nodes, m.name, fill, round))
		go func() { profiled <- saveProfile(port, file) }()
	} else {
		profiled <- nil
	}
	for i := range pods {
		next <- i
	}
	close(next)
	workers.Wait()
	creation := time.Since(start)
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d creations failed, the first: %v", n, firstErr.Load())
	}

	// Wait for every pod to be bound, or for binding to stall.
	last, lastCount := time.Now(), 0
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(time.Second):
			mu.Lock()
			count := len(boundAt)
			mu.Unlock()
			if count != lastCount {
				last, lastCount = time.Now(), count
			} else if time.Since(last) > stallLimit {
				waiting = false
			}
		}
	}
	cpu := cpuSeconds(b, schedPID) - cpuBefore
	attemptsAfter := attempts(b, port)
	if err := <-profiled; err != nil {
		b.Errorf("kube-scheduler's CPU profile: %v", err)
	}

	mu.Lock()
	var latencies []time.Duration
	var binds []time.Time
	for i := range pods {
		if at, ok := boundAt[fmt.Sprintf("pod-%05d", i)]; ok {
			latencies = append(latencies, at.Sub(createdAt[i]))
			binds = append(binds, at)
		}
	}
	mu.Unlock()
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	sort.Slice(binds, func(i, j int) bool { return binds[i].Before(binds[j]) })
	load, _ := os.ReadFile("/proc/loadavg")
	r := result{
		Nodes: nodes, Model: m.name, Fill: fill, Round: round, Pods: pods, Bound: len(binds),
		CreatedPerSec: float64(pods) / creation.Seconds(),
		PodsPerSec:    steadyRate(binds),
		P50Ms:         ms(percentile(latencies, 0.50)),
		P99Ms:         ms(percentile(latencies, 0.99)),
		SchedCPUSec:   cpu,
		Attempts:      allAttempts(attemptsAfter) - allAttempts(attemptsBefore),
		Unschedulable: attemptsAfter["unschedulable"] - attemptsBefore["unschedulable"],
		SchedPeakRSS:  statusBytes(b, schedPID, "VmHWM"),
		APIServerRSS:  statusBytes(b, apiPID, "VmRSS"),
		APIServerPeak: statusBytes(b, apiPID, "VmHWM"),
		Slices:        slices, SliceBytes: sliceBytes, DevicesPerNode: devicesPerNode,
		Load: strings.Join(strings.Fields(string(load))[:3], " "),
	}
	line, _ := json.Marshal(r)
	fmt.Printf("scale: %s\n", line)
	b.ReportMetric(r.PodsPerSec, "pods/s")
	b.ReportMetric(r.P99Ms, "p99-ms")
	if len(binds) < pods {
		b.Errorf("%d of %d pods bound; binding stalled for %s; kube-scheduler's log ends:\n%s",
			len(binds), pods, stallLimit, c.SchedulerLog())
	}
}

func nodeName(i int) string { return fmt.Sprintf("node-%04d", i) }

// publish creates, for every node, the slices `resmgr slices` prints for it with the model's
// settings, and returns the devices per node.
func publish(b *testing.B, dyn dynamic.Interface, resmgr string, m model, uids []string) int {
	b.Helper()
	gvr := schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceslices"}
	var devices atomic.Int64
	errs := make(chan error, len(uids))
	next := make(chan int)
	var workers sync.WaitGroup
	for range 4 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := range next {
				args := append([]string{"slices", "--node-name", nodeName(i), "--node-uid", uids[i],
					"--topology", topology, "--reserved-cpu-count", strconv.Itoa(reservedCPUs),
					"--output", "json"}, m.flags...)
				out, err := exec.Command(resmgr, args...).Output()
				if err != nil {
					errs <- fmt.Errorf("resmgr %s: %w", strings.Join(args, " "), err)
					continue
				}
				var list unstructured.UnstructuredList
				if err := list.UnmarshalJSON(out); err != nil {
					errs <- fmt.Errorf("resmgr slices for %s printed no List: %w", nodeName(i), err)
					continue
				}
				count := 0
				for _, item := range list.Items {
					devs, _, _ := unstructured.NestedSlice(item.Object, "spec", "devices")
					count += len(devs)
					if _, err := dyn.Resource(gvr).Create(context.Background(), &item, metav1.CreateOptions{}); err != nil {
						errs <- fmt.Errorf("creating a slice of %s: %w", nodeName(i), err)
					}
				}
				devices.Store(int64(count))
			}
		}()
	}
	for i := range uids {
		next <- i
	}
	close(next)
	workers.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return int(devices.Load())
}

// stored lists the slices and returns how many there are and their JSON bytes, as the API
// server has them (metadata included).
func stored(b *testing.B, client kubernetes.Interface) (int, int) {
	b.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	total := 0
	for i := range list.Items {
		raw, err := json.Marshal(&list.Items[i])
		if err != nil {
			b.Fatal(err)
		}
		total += len(raw)
	}
	return len(list.Items), total
}

// settle waits until the scheduler has digested the nodes and slices: until it uses less than
// 5 % of a CPU over a second, for at most a minute. A benchmark's warm-up, not a test's
// synchronization.
func settle(pid int) {
	deadline := time.Now().Add(time.Minute)
	before, _ := readCPU(pid)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		now, err := readCPU(pid)
		if err != nil || now-before < 0.05 {
			return
		}
		before = now
	}
}

func cpuSeconds(b *testing.B, pid int) float64 {
	b.Helper()
	s, err := readCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports here.
const clockTicks = 100

// readCPU is the process's user and system CPU time, from /proc/PID/stat.
func readCPU(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces; fields count from after it.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, fields[11], fields[12])
	}
	return float64(utime+stime) / clockTicks, nil
}

// statusBytes is a size field (VmRSS, VmHWM) of /proc/PID/status, in bytes.
func statusBytes(b *testing.B, pid int, field string) int64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("/proc/%d/status: %s", pid, line)
			}
			return kib * 1024
		}
	}
	b.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// steadyRate is pods bound per second between the 10th and the 90th percentile of bind times:
// the start (the scheduler warming up, creation ramping) and the tail are left out.
func steadyRate(binds []time.Time) float64 {
	if len(binds) < 10 {
		return 0
	}
	lo, hi := len(binds)/10, len(binds)*9/10
	span := binds[hi].Sub(binds[lo]).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(hi-lo) / span
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(float64(len(sorted)-1)*q)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// freePort is a loopback TCP port nothing listens on now.
func freePort(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// saveProfile saves 30 s of kube-scheduler's CPU profile, served on port, to file.
func saveProfile(port int, file string) error {
	// The scheduler's serving certificate is self-signed; the profile is read once, on loopback.
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/profile?seconds=30", port))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// attempts reads kube-scheduler's scheduler_schedule_attempts_total by result.
func attempts(b *testing.B, port int) map[string]int {
	b.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/metrics", port))
	if err != nil {
		b.Fatalf("kube-scheduler's metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("kube-scheduler's metrics: %s %v", resp.Status, err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, "scheduler_schedule_attempts_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			b.Fatalf("kube-scheduler's metric line %q: %v", line, err)
		}
		for _, label := range strings.Split(labels, ",") {
			if result, ok := strings.CutPrefix(label, "result="); ok {
				out[strings.Trim(result, `"`)] += int(n)
			}
		}
	}
	return out
}

// allAttempts sums attempts of every result.
func allAttempts(byResult map[string]int) int {
	n := 0
	for _, v := range byResult {
		n += v
	}
	return n
}
