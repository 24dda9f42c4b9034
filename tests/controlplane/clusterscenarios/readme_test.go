package clusterscenarios

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// smallestNodeCPUs is what a claim may take on the smallest node `cargo xtask cluster up`
// accepts: two CPUs, one of them reserved.
const smallestNodeCPUs = 1

// repoRoot is the repository's root, two levels above the chart.
func repoRoot() string { return filepath.Join(filepath.Dir(node.Chart()), "..", "..") }

// tryIt is the command block of README.md's "Try it" section.
func tryIt(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Try it")
	if ok {
		_, section, ok = strings.Cut(section, "```sh\n")
	}
	if ok {
		section, _, ok = strings.Cut(section, "```")
	}
	if !ok {
		t.Fatal("README.md has no \"## Try it\" section with a ```sh block")
	}
	return section
}

// README.md's "Try it", as a newcomer on the smallest machine does it: every `kubectl apply -f`
// of its block applies the file it names, as it is. Each asks for no more than the smallest node
// has (one CPU to claim), so it must run here whatever this machine's size: its pod runs (never
// Pending), the kernel runs it on exactly its claim's CPUs, and `kubectl logs` shows them, as
// the example's comment says.
func TestTheReadmesTryItPinsItsPodOnTheSmallestNode(t *testing.T) {
	var files []string
	for _, line := range strings.Split(tryIt(t), "\n") {
		command, _, _ := strings.Cut(line, "#")
		if f := strings.Fields(command); len(f) == 4 && f[0] == "kubectl" && f[1] == "apply" && f[2] == "-f" {
			files = append(files, f[3])
		}
	}
	if len(files) == 0 {
		t.Fatal("README.md's \"Try it\" applies no file")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			path := filepath.Join(repoRoot(), file)
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			name := fitsTheSmallestNode(t, string(text))
			if _, err := node.Kubectl("apply", "-f", path); err != nil {
				t.Fatal(err)
			}
			// The example's sleep ignores SIGTERM: a short grace period, not its 30 s.
			t.Cleanup(func() { _, _ = node.Kubectl("delete", "--wait=true", "--grace-period=1", "-f", path) })
			poll(t, "pod "+name+" to run", limit, func() (bool, error) {
				c, cancel := cx()
				defer cancel()
				pod, err := node.Client.CoreV1().Pods("default").Get(c, name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				for _, cond := range pod.Status.Conditions {
					if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
						t.Fatalf("%s: the scheduler refuses the pod on this node: %s", file, cond.Message)
					}
				}
				return pod.Status.Phase == corev1.PodRunning, nil
			})
			pod := running(t, "default", name)
			container := pod.Spec.Containers[0].Name
			p := placement(t, pod, container)
			granted := grantedCPUs(t, p, podClaim(t, pod))
			if p.CgroupCPUs != granted {
				t.Fatalf("the kernel runs %s on %q, its claim holds %q", name, p.CgroupCPUs, granted)
			}
			var logs string
			poll(t, "the pod to print its CPUs", limit, func() (bool, error) {
				logs, err = node.Kubectl("logs", name, "-c", container)
				return strings.Contains(logs, "Cpus_allowed_list:\t"+granted+"\n"), err
			})
			t.Logf("%s: the pod runs on its claim's %q; kubectl logs %s:\n%s", file, granted, name, strings.TrimSpace(logs))
		})
	}
}

// fitsTheSmallestNode checks that an example's claims and its pod's CPU requests ask for no
// more than the smallest node has, and returns its pod's name.
func fitsTheSmallestNode(t *testing.T, text string) string {
	t.Helper()
	most := resource.NewQuantity(smallestNodeCPUs, resource.DecimalSI)
	name := ""
	for _, doc := range strings.Split(text, "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "Pod":
			var pod corev1.Pod
			if err := yaml.UnmarshalStrict([]byte(doc), &pod); err != nil {
				t.Fatal(err)
			}
			name = pod.Name
			total := resource.Quantity{}
			for _, c := range pod.Spec.Containers {
				total.Add(*c.Resources.Requests.Cpu())
			}
			if total.Cmp(*most) > 0 {
				t.Fatalf("pod %s requests %s CPUs; the smallest node has %s", pod.Name, total.String(), most.String())
			}
		case "ResourceClaimTemplate":
			var tmpl resourcev1.ResourceClaimTemplate
			if err := yaml.UnmarshalStrict([]byte(doc), &tmpl); err != nil {
				t.Fatal(err)
			}
			for _, r := range tmpl.Spec.Spec.Devices.Requests {
				if r.Exactly == nil || r.Exactly.Capacity == nil {
					continue
				}
				if cpu, ok := r.Exactly.Capacity.Requests["cpu"]; ok && cpu.Cmp(*most) > 0 {
					t.Fatalf("claim template %s asks for %s CPUs; the smallest node has %s", tmpl.Name, cpu.String(), most.String())
				}
			}
		}
	}
	if name == "" {
		t.Fatal("the example has no Pod")
	}
	return name
}
