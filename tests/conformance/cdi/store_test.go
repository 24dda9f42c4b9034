// Conformance of our CDI spec store (crates/cdi) with the CDI cache containerd and CRI-O use:
// the upstream cache loads the directory our store wrote without errors, resolves every qualified
// name the store returned, and injecting a name yields exactly the edits we wrote; a claim our
// store removed is gone after a refresh; an auto-refreshing cache (inotify) sees every write whole;
// a claim UID starting with a digit loads at the version we declared. Our minimum-version
// computation and validation are checked against upstream's.
//
// The store is driven through the `cdi_store` example (crates/cdi/examples/cdi_store.rs).
package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/resmgr/resmgr/tests/conformance/internal/rustbin"
)

const vendor = "resmgr.example.com"

// A Kubernetes UID as the API server generates them: it starts with a digit.
const digitUID = "8c3f9a5e-2f6d-4c1a-9e3b-2d7f1a6c4e80"

// cdiStore runs the example with args and stdin and returns its stdout; any failure fails the
// test with the example's stderr.
func cdiStore(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	bin, err := rustbin.Path("examples/cdi_store")
	if err != nil {
		t.Fatal(err)
	}
	out, err := runStore(bin, stdin, args...)
	if err != nil {
		t.Fatalf("cdi_store %s: %v", strings.Join(args, " "), err)
	}
	return out
}

type storeError struct {
	err    error
	stderr string
}

func (e *storeError) Error() string { return e.err.Error() + ": " + e.stderr }

func (e *storeError) Unwrap() error { return e.err }

func runStore(bin string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	// Expected failures (the validator rejecting a spec) need no backtrace, which costs a
	// quarter of a second to symbolize in a debug build.
	cmd.Env = append(os.Environ(), "RUST_LIB_BACKTRACE=0")
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &storeError{err, stderr.String()}
	}
	return out, nil
}

// writeClaim writes a claim's spec through our store and returns the qualified names.
func writeClaim(t *testing.T, dir, uid string, edits []cdispec.ContainerEdits) []string {
	t.Helper()
	in, err := json.Marshal(edits)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	if err := json.Unmarshal(cdiStore(t, in, "write", dir, vendor, uid), &names); err != nil {
		t.Fatalf("parsing the names cdi_store returned: %v", err)
	}
	if len(names) != len(edits) {
		t.Fatalf("cdi_store returned %d names for %d edits: %v", len(names), len(edits), names)
	}
	return names
}

func removeClaim(t *testing.T, dir, uid string) {
	t.Helper()
	if out := strings.TrimSpace(string(cdiStore(t, nil, "remove", dir, vendor, uid))); out != "true" {
		t.Fatalf("remove %s reported %q, want true", uid, out)
	}
}

// newCache is a cache over dir that refreshes only when asked, as containerd calls it.
func newCache(t *testing.T, dir string) *cdi.Cache {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("NewCache: %v", err)
	}
	return cache
}

func requireNoCacheErrors(t *testing.T, cache *cdi.Cache) {
	t.Helper()
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("the cdi cache recorded errors: %v", errs)
	}
}

func freshOCISpec() *oci.Spec {
	return &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}}
}

func envEdits(entries ...string) cdispec.ContainerEdits {
	return cdispec.ContainerEdits{Env: entries}
}

func ptr[T any](v T) *T { return &v }

// richEdits uses every kind of edit, which needs CDI 1.1.0.
func richEdits() cdispec.ContainerEdits {
	mode := os.FileMode(0o640)
	return cdispec.ContainerEdits{
		Env: []string{"RESMGR_RICH=1", "EMPTY="},
		DeviceNodes: []*cdispec.DeviceNode{{
			Path: "/dev/resmgr-null", HostPath: "/dev/null", Type: "c", Major: 1, Minor: 3,
			FileMode: &mode, Permissions: "rw", UID: ptr(uint32(0)), GID: ptr(uint32(5)),
		}},
		NetDevices: []*cdispec.LinuxNetDevice{{HostInterfaceName: "eth9", Name: "net0"}},
		Hooks: []*cdispec.Hook{{
			HookName: "createContainer", Path: "/bin/true", Args: []string{"true", "x"},
			Env: []string{"HOOK=1"}, Timeout: ptr(5),
		}},
		Mounts: []*cdispec.Mount{{
			HostPath: "/tmp", ContainerPath: "/mnt/resmgr", Type: "bind",
			Options: []string{"rbind", "ro"},
		}},
		IntelRdt: &cdispec.IntelRdt{
			ClosID: "gold", L3CacheSchema: "L3:0=f", Schemata: []string{"MB:0=50"},
			EnableMonitoring: true,
		},
		AdditionalGIDs: []uint32{42},
	}
}

func typedMountEdits() cdispec.ContainerEdits {
	return cdispec.ContainerEdits{
		Env:    []string{"RESMGR_MOUNT=1"},
		Mounts: []*cdispec.Mount{{HostPath: "/tmp", ContainerPath: "/data", Type: "bind"}},
	}
}

func TestCacheLoadsResolvesAndInjectsEveryClaimWeWrite(t *testing.T) {
	dir := t.TempDir()
	claims := []struct {
		uid     string
		edits   []cdispec.ContainerEdits
		version string
	}{
		{digitUID, []cdispec.ContainerEdits{
			envEdits("RESMGR_CLAIM="+digitUID, "RESMGR_RESULT=0"),
			envEdits("RESMGR_CLAIM="+digitUID, "RESMGR_RESULT=1"),
		}, "0.3.0"},
		{"claim-rich", []cdispec.ContainerEdits{richEdits()}, "1.1.0"},
		{"claim-mount", []cdispec.ContainerEdits{envEdits("A=1"), typedMountEdits()}, "0.4.0"},
	}
	var allNames []string
	namesOf := map[string][]string{}
	for _, c := range claims {
		names := writeClaim(t, dir, c.uid, c.edits)
		for i, name := range names {
			want := vendor + "/device=claim-" + c.uid + "-" + strconv.Itoa(i)
			if name != want {
				t.Errorf("claim %s result %d: name %q, want %q", c.uid, i, name, want)
			}
		}
		namesOf[c.uid] = names
		allNames = append(allNames, names...)
	}

	cache := newCache(t, dir)
	requireNoCacheErrors(t, cache)
	listed := cache.ListDevices()
	slices.Sort(allNames)
	if !slices.Equal(listed, allNames) {
		t.Fatalf("cache lists %v, want exactly %v", listed, allNames)
	}

	for _, c := range claims {
		path := filepath.Join(dir, vendor+"-device_"+c.uid+".json")
		for i, name := range namesOf[c.uid] {
			dev := cache.GetDevice(name)
			if dev == nil {
				t.Fatalf("cache does not resolve %s", name)
			}
			spec := dev.GetSpec()
			if spec.GetPath() != path {
				t.Errorf("%s comes from %s, want %s", name, spec.GetPath(), path)
			}
			if spec.Version != c.version {
				t.Errorf("claim %s declares cdiVersion %q, want %q", c.uid, spec.Version, c.version)
			}
			if min, _ := cdispec.MinimumRequiredVersion(spec.Spec); min != spec.Version {
				t.Errorf("claim %s declares %q but upstream computes the minimum %q", c.uid, spec.Version, min)
			}

			// Injecting the name must do exactly what applying the edits we passed does.
			got := freshOCISpec()
			if unresolved, err := cache.InjectDevices(got, name); err != nil {
				t.Fatalf("InjectDevices(%s): %v (unresolved %v)", name, err, unresolved)
			}
			want := freshOCISpec()
			if err := (&cdi.ContainerEdits{ContainerEdits: &c.edits[i]}).Apply(want); err != nil {
				t.Fatalf("applying the edits directly: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				gotJSON, _ := json.Marshal(got)
				wantJSON, _ := json.Marshal(want)
				t.Errorf("injecting %s gave\n%s\nwant\n%s", name, gotJSON, wantJSON)
			}
			wantEnv := append([]string{"PATH=/bin"}, c.edits[i].Env...)
			if !slices.Equal(got.Process.Env, wantEnv) {
				t.Errorf("injecting %s set env %v, want %v", name, got.Process.Env, wantEnv)
			}
		}
	}

	// All devices of a claim at once, as the kubelet passes them for one container.
	got := freshOCISpec()
	if unresolved, err := cache.InjectDevices(got, namesOf[digitUID]...); err != nil {
		t.Fatalf("InjectDevices(all of %s): %v (unresolved %v)", digitUID, err, unresolved)
	}
	if !slices.Contains(got.Process.Env, "RESMGR_RESULT=1") || !slices.Contains(got.Process.Env, "RESMGR_CLAIM="+digitUID) {
		t.Errorf("injecting every device of %s set env %v", digitUID, got.Process.Env)
	}
}

func TestRemovedClaimIsGoneAfterRefresh(t *testing.T) {
	dir := t.TempDir()
	kept := writeClaim(t, dir, "claim-kept", []cdispec.ContainerEdits{envEdits("KEPT=1")})
	gone := writeClaim(t, dir, digitUID, []cdispec.ContainerEdits{envEdits("GONE=1"), envEdits("GONE=2")})
	cache := newCache(t, dir)
	requireNoCacheErrors(t, cache)
	for _, name := range append(slices.Clone(kept), gone...) {
		if cache.GetDevice(name) == nil {
			t.Fatalf("before removal the cache does not resolve %s", name)
		}
	}

	removeClaim(t, dir, digitUID)
	if err := cache.Refresh(); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	requireNoCacheErrors(t, cache)
	if listed := cache.ListDevices(); !slices.Equal(listed, kept) {
		t.Fatalf("after removal the cache lists %v, want %v", listed, kept)
	}
	unresolved, err := cache.InjectDevices(freshOCISpec(), gone...)
	if err == nil || !slices.Equal(unresolved, gone) {
		t.Fatalf("injecting removed devices: unresolved %v, err %v; want all unresolved", unresolved, err)
	}
	if _, err := cache.InjectDevices(freshOCISpec(), kept...); err != nil {
		t.Fatalf("injecting the kept claim: %v", err)
	}
	// Removal is idempotent.
	if out := strings.TrimSpace(string(cdiStore(t, nil, "remove", dir, vendor, digitUID))); out != "false" {
		t.Fatalf("second removal reported %q, want false", out)
	}
}

func TestDigitLeadingUIDIsAcceptedAtTheWrittenVersion(t *testing.T) {
	dir := t.TempDir()
	names := writeClaim(t, dir, digitUID, []cdispec.ContainerEdits{envEdits("A=1")})
	path := filepath.Join(dir, vendor+"-device_"+digitUID+".json")
	spec, err := cdi.ReadSpec(path, 0)
	if err != nil {
		t.Fatalf("upstream ReadSpec rejects our spec: %v", err)
	}
	if spec.Version != "0.3.0" {
		t.Fatalf("cdiVersion %q, want 0.3.0: the claim- prefix keeps a digit-leading UID at the baseline", spec.Version)
	}
	if spec.GetDevice("claim-"+digitUID+"-0") == nil || len(names) != 1 {
		t.Fatalf("device claim-%s-0 missing (names %v)", digitUID, names)
	}
	cache := newCache(t, dir)
	requireNoCacheErrors(t, cache)
	if _, err := cache.InjectDevices(freshOCISpec(), names...); err != nil {
		t.Fatalf("InjectDevices: %v", err)
	}

	// Why the prefix matters: the bare UID as a device name at 0.3.0 is rejected upstream, and
	// by our validator too.
	bare := `{"cdiVersion":"0.3.0","kind":"` + vendor + `/device","devices":[{"name":"` + digitUID +
		`","containerEdits":{"env":["A=1"]}}]}`
	bad := filepath.Join(t.TempDir(), "bare.json")
	if err := os.WriteFile(bad, []byte(bare), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cdi.ReadSpec(bad, 0); err == nil {
		t.Fatal("upstream accepted a digit-leading device name at 0.3.0")
	}
	if ok, stderr := ourValidate(t, []byte(bare)); ok {
		t.Fatal("our validator accepted a digit-leading device name at 0.3.0")
	} else if !strings.Contains(stderr, "0.5.0") {
		t.Fatalf("our validator's error does not name the version needed: %s", stderr)
	}
}

func TestClaimsListsOnlyOurSpecs(t *testing.T) {
	dir := t.TempDir()
	writeClaim(t, dir, digitUID, []cdispec.ContainerEdits{envEdits("A=1")})
	writeClaim(t, dir, "claim-b", []cdispec.ContainerEdits{envEdits("B=1")})
	// Upstream's own writer puts specs of other vendors and classes in the same directory.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	other := &cdispec.Spec{
		Version: "0.3.0", Kind: "other.example.com/device",
		Devices: []cdispec.Device{{Name: "claim-x-0", ContainerEdits: envEdits("X=1")}},
	}
	gpu := &cdispec.Spec{
		Version: "0.3.0", Kind: vendor + "/gpu",
		Devices: []cdispec.Device{{Name: "g0", ContainerEdits: envEdits("G=1")}},
	}
	for _, s := range []*cdispec.Spec{other, gpu} {
		name, err := cdi.GenerateNameForTransientSpec(s, "claim-y")
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.WriteSpec(s, name+".json"); err != nil {
			t.Fatalf("WriteSpec: %v", err)
		}
	}
	var claims []string
	if err := json.Unmarshal(cdiStore(t, nil, "claims", dir, vendor), &claims); err != nil {
		t.Fatal(err)
	}
	if want := []string{digitUID, "claim-b"}; !slices.Equal(claims, want) {
		t.Fatalf("claims %v, want %v", claims, want)
	}
	// And the runtime sees all four specs without conflict.
	if err := cache.Refresh(); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if n := len(cache.ListDevices()); n != 4 {
		t.Fatalf("cache lists %d devices, want 4: %v", n, cache.ListDevices())
	}
}

// ourValidate runs our validator on a spec and returns whether it accepted it, and its stderr.
func ourValidate(t *testing.T, spec []byte) (bool, string) {
	t.Helper()
	bin, err := rustbin.Path("examples/cdi_store")
	if err != nil {
		t.Fatal(err)
	}
	_, err = runStore(bin, spec, "validate")
	if err == nil {
		return true, ""
	}
	var se *storeError
	var exit *exec.ExitError
	if !errors.As(err, &se) || !errors.As(se.err, &exit) {
		t.Fatalf("running the validator: %v", err)
	}
	return false, se.stderr
}

// Specs exercising each row of the minimum-version table, and their combinations.
var versionCases = map[string]string{
	"baseline":          `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`,
	"untyped mount":     `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"mounts":[{"hostPath":"/a","containerPath":"/b"}]}}]}`,
	"mount type":        `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"mounts":[{"hostPath":"/a","containerPath":"/b","type":"bind"}]}}]}`,
	"spec mount type":   `{"kind":"a.com/x","containerEdits":{"mounts":[{"hostPath":"/a","containerPath":"/b","type":"bind"}]},"devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`,
	"host path":         `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"deviceNodes":[{"path":"/dev/x","hostPath":"/dev/null"}]}}]}`,
	"digit name":        `{"kind":"a.com/x","devices":[{"name":"0d","containerEdits":{"env":["A=1"]}}]}`,
	"spec annotations":  `{"kind":"a.com/x","annotations":{"k":"v"},"devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`,
	"device annotation": `{"kind":"a.com/x","devices":[{"name":"d","annotations":{"k":"v"},"containerEdits":{"env":["A=1"]}}]}`,
	"dotted class":      `{"kind":"a.com/x.y","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`,
	"intel rdt":         `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"intelRdt":{"closID":"c"}}}]}`,
	"additional gids":   `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"additionalGids":[5]}}]}`,
	"net devices":       `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"netDevices":[{"hostInterfaceName":"e","name":"n"}]}}]}`,
	"rdt schemata":      `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"intelRdt":{"schemata":["L3:0=f"]}}}]}`,
	"empty schemata":    `{"kind":"a.com/x","devices":[{"name":"d","containerEdits":{"intelRdt":{"schemata":[]}}}]}`,
	"rdt monitoring":    `{"kind":"a.com/x","containerEdits":{"intelRdt":{"enableMonitoring":true}},"devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`,
	"digit and gids":    `{"kind":"a.com/x","devices":[{"name":"0d","containerEdits":{"additionalGids":[5]}}]}`,
	"yaml mount type":   "kind: a.com/x\ndevices:\n- name: d\n  containerEdits:\n    mounts:\n    - {hostPath: /a, containerPath: /b, type: bind}\n",
}

func TestMinimumVersionAgreesWithUpstream(t *testing.T) {
	for name, doc := range versionCases {
		t.Run(name, func(t *testing.T) {
			raw, err := cdi.ParseSpec([]byte(doc))
			if err != nil {
				t.Fatalf("upstream cannot parse the case: %v", err)
			}
			want, err := cdispec.MinimumRequiredVersion(raw)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.TrimSpace(string(cdiStore(t, []byte(doc), "min-version")))
			if got != want {
				t.Fatalf("our minimum %q, upstream's %q", got, want)
			}
		})
	}
}

// Specs that upstream and we both accept or both reject, and the few where we are deliberately
// stricter (the length limits the specification states and upstream does not check).
var validationCases = []struct {
	name           string
	doc            string
	upstream, ours bool
}{
	{"valid", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, true, true},
	{"v-prefixed version", `{"cdiVersion":"v0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, true, true},
	{"newer than needed", `{"cdiVersion":"1.1.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, true, true},
	{"unknown version", `{"cdiVersion":"9.9.9","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, false, false},
	{"below minimum", `{"cdiVersion":"0.4.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"additionalGids":[1]}}]}`, false, false},
	{"unknown field", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","cpuset":"0","containerEdits":{"env":["A=1"]}}]}`, false, false},
	{"no devices", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[]}`, false, false},
	{"duplicate device", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}},{"name":"d","containerEdits":{"env":["B=1"]}}]}`, false, false},
	{"empty edits", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{}}]}`, false, false},
	{"bad env", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"env":["=1"]}}]}`, false, false},
	{"bad kind", `{"cdiVersion":"0.3.0","kind":"a.com","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, false, false},
	{"bad vendor", `{"cdiVersion":"0.3.0","kind":"1a.com/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, false, false},
	{"bad device name", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d-","containerEdits":{"env":["A=1"]}}]}`, false, false},
	{"bad node type", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"deviceNodes":[{"path":"/dev/x","type":"z"}]}}]}`, false, false},
	{"negative major", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"deviceNodes":[{"path":"/dev/x","major":-1}]}}]}`, false, false},
	{"bad permissions", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"deviceNodes":[{"path":"/dev/x","permissions":"rx"}]}}]}`, false, false},
	{"empty mount path", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"mounts":[{"hostPath":"/a","containerPath":""}]}}]}`, false, false},
	{"bad hook name", `{"cdiVersion":"0.3.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"hooks":[{"hookName":"preStart","path":"/bin/true"}]}}]}`, false, false},
	{"bad clos id", `{"cdiVersion":"0.7.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"intelRdt":{"closID":".."}}}]}`, false, false},
	{"duplicate net device", `{"cdiVersion":"1.1.0","kind":"a.com/x","devices":[{"name":"d","containerEdits":{"netDevices":[{"hostInterfaceName":"e","name":"a"},{"hostInterfaceName":"e","name":"b"}]}}]}`, false, false},
	{"class over 63 characters", `{"cdiVersion":"0.3.0","kind":"a.com/` + strings.Repeat("c", 64) + `","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, true, false},
	{"vendor over 253 characters", `{"cdiVersion":"0.3.0","kind":"` + strings.Repeat("v", 254) + `/x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}`, true, false},
}

func TestValidationAgreesWithUpstream(t *testing.T) {
	for _, c := range validationCases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "spec.json")
			if err := os.WriteFile(path, []byte(c.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := cdi.ReadSpec(path, 0)
			if upstream := err == nil; upstream != c.upstream {
				t.Fatalf("upstream accepts: %v (err %v), want %v", upstream, err, c.upstream)
			}
			if ours, stderr := ourValidate(t, []byte(c.doc)); ours != c.ours {
				t.Fatalf("we accept: %v (%s), want %v", ours, stderr, c.ours)
			}
		})
	}
}

// waitForCache polls an auto-refreshing cache until done reports true, failing the test when
// the cache records an error at any poll (a spec seen half-written) or when the watcher has not
// caught up within the deadline.
func waitForCache(t *testing.T, cache *cdi.Cache, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		requireNoCacheErrors(t, cache)
		if done() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the auto-refreshing cache did not see %s within 10 s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// CRI-O and containerd's CDI cache refresh themselves from an inotify watch of the spec
// directory. Our store writes a temporary file that the watcher ignores and renames it into
// place, so the watcher sees each spec whole: every write, rewrite and removal shows up without
// an explicit Refresh, and the cache never records a parse error on the way.
func TestAutoRefreshingCacheSeesEveryWriteWhole(t *testing.T) {
	dir := t.TempDir()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(true))
	if err != nil {
		t.Fatalf("NewCache: %v", err)
	}
	t.Cleanup(func() { _ = cache.Configure(cdi.WithAutoRefresh(false)) })

	injected := func(name string) []string {
		spec := freshOCISpec()
		if _, err := cache.InjectDevices(spec, name); err != nil {
			return nil
		}
		return spec.Process.Env
	}
	var names []string
	for i := range 20 {
		want := "REVISION=" + strconv.Itoa(i)
		names = writeClaim(t, dir, digitUID, []cdispec.ContainerEdits{envEdits(want, "PADDING="+strings.Repeat("x", 64*1024))})
		waitForCache(t, cache, "revision "+strconv.Itoa(i), func() bool {
			return slices.Contains(injected(names[0]), want)
		})
	}

	removeClaim(t, dir, digitUID)
	waitForCache(t, cache, "the removal", func() bool {
		return len(cache.ListDevices()) == 0 && cache.GetDevice(names[0]) == nil
	})
}
