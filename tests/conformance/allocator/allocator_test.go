package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/yaml"
)

// The vectors, as the Rust test writes them (policy::Device and policy::AllocationResult in
// their serde form).
type vectors struct {
	Driver string  `json:"driver"`
	Pool   string  `json:"pool"`
	Cases  []vcase `json:"cases"`
}

type vcase struct {
	Name               string     `json:"name"`
	ConsumableCapacity bool       `json:"consumableCapacity"`
	Devices            []device   `json:"devices"`
	Allocated          [][]result `json:"allocated"`
	Claim              claim      `json:"claim"`
	Expect             expect     `json:"expect"`
}

type device struct {
	Name                     string              `json:"name"`
	Attributes               map[string]attr     `json:"attributes"`
	Capacities               map[string]capacity `json:"capacities"`
	AllowMultipleAllocations bool                `json:"allow_multiple_allocations"`
}

type attr struct {
	Int     *int64  `json:"Int"`
	Bool    *bool   `json:"Bool"`
	String  *string `json:"String"`
	Version *string `json:"Version"`
}

type capacity struct {
	Value         string         `json:"value"`
	RequestPolicy *requestPolicy `json:"request_policy"`
}

type requestPolicy struct {
	Default *string `json:"default"`
	Valid   struct {
		Range *struct {
			Min  string  `json:"min"`
			Max  *string `json:"max"`
			Step *string `json:"step"`
		} `json:"Range"`
		Values []string `json:"Values"`
	} `json:"valid"`
}

type result struct {
	Request          string            `json:"request"`
	Pool             string            `json:"pool"`
	Device           string            `json:"device"`
	ShareID          *string           `json:"share_id"`
	ConsumedCapacity map[string]string `json:"consumed_capacity"`
}

type claim struct {
	Requests    []request    `json:"requests"`
	Constraints []constraint `json:"constraints"`
}

type request struct {
	Name      string            `json:"name"`
	Count     int64             `json:"count"`
	Selectors []selector        `json:"selectors"`
	Capacity  map[string]string `json:"capacity"`
	// Capacities every device must publish, as a DeviceClass selecting CPU devices does.
	HasCapacity []string `json:"hasCapacity"`
}

type selector struct {
	Attribute string `json:"attribute"`
	Value     attr   `json:"value"`
}

type constraint struct {
	Requests       []string `json:"requests"`
	MatchAttribute string   `json:"matchAttribute"`
}

type expect struct {
	Results *[]expected `json:"results"`
	Error   *string     `json:"error"`
}

type expected struct {
	Request          string            `json:"request"`
	Device           string            `json:"device"`
	Shared           bool              `json:"shared"`
	ConsumedCapacity map[string]string `json:"consumedCapacity"`
}

const className = "cpu.resmgr.io"

func load(t *testing.T) vectors {
	t.Helper()
	path := filepath.Join("..", "..", "..", "crates", "policy", "tests", "fixtures", "scheduler-vectors.json")
	bytes, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the vectors: %v", err)
	}
	var v vectors
	decoder := json.NewDecoder(strings.NewReader(string(bytes)))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&v); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	if len(v.Cases) == 0 {
		t.Fatalf("%s holds no case", path)
	}
	return v
}

func quantity(t *testing.T, s string) resource.Quantity {
	t.Helper()
	q, err := resource.ParseQuantity(s)
	if err != nil {
		t.Fatalf("quantity %q: %v", s, err)
	}
	return q
}

func attribute(t *testing.T, a attr) resourceapi.DeviceAttribute {
	t.Helper()
	switch {
	case a.Int != nil:
		return resourceapi.DeviceAttribute{IntValue: a.Int}
	case a.Bool != nil:
		return resourceapi.DeviceAttribute{BoolValue: a.Bool}
	case a.String != nil:
		return resourceapi.DeviceAttribute{StringValue: a.String}
	case a.Version != nil:
		return resourceapi.DeviceAttribute{VersionValue: a.Version}
	}
	t.Fatalf("an attribute without a value")
	return resourceapi.DeviceAttribute{}
}

// The slice as the scheduler reads it: without DRAConsumableCapacity the API server has
// dropped allowMultipleAllocations and every request policy.
func slice(t *testing.T, v vectors, c vcase) *resourceapi.ResourceSlice {
	t.Helper()
	node := v.Pool
	devices := make([]resourceapi.Device, 0, len(c.Devices))
	for _, d := range c.Devices {
		out := resourceapi.Device{
			Name:       d.Name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{},
		}
		for name, a := range d.Attributes {
			out.Attributes[resourceapi.QualifiedName(name)] = attribute(t, a)
		}
		for name, capacity := range d.Capacities {
			dc := resourceapi.DeviceCapacity{Value: quantity(t, capacity.Value)}
			if p := capacity.RequestPolicy; p != nil && c.ConsumableCapacity {
				policy := &resourceapi.CapacityRequestPolicy{}
				if p.Default != nil {
					q := quantity(t, *p.Default)
					policy.Default = &q
				}
				if r := p.Valid.Range; r != nil {
					min := quantity(t, r.Min)
					policy.ValidRange = &resourceapi.CapacityRequestPolicyRange{Min: &min}
					if r.Max != nil {
						max := quantity(t, *r.Max)
						policy.ValidRange.Max = &max
					}
					if r.Step != nil {
						step := quantity(t, *r.Step)
						policy.ValidRange.Step = &step
					}
				}
				for _, value := range p.Valid.Values {
					policy.ValidValues = append(policy.ValidValues, quantity(t, value))
				}
				dc.RequestPolicy = policy
			}
			out.Capacity[resourceapi.QualifiedName(name)] = dc
		}
		if d.AllowMultipleAllocations && c.ConsumableCapacity {
			allow := true
			out.AllowMultipleAllocations = &allow
		}
		devices = append(devices, out)
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + v.Driver},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   v.Driver,
			Pool:     resourceapi.ResourcePool{Name: v.Pool, Generation: 1, ResourceSliceCount: 1},
			NodeName: &node,
			Devices:  devices,
		},
	}
}

// An equality selector in CEL: a bare attribute name is in the driver's domain.
func celSelector(t *testing.T, driver string, s selector) resourceapi.DeviceSelector {
	t.Helper()
	domain, id, qualified := strings.Cut(s.Attribute, "/")
	if !qualified {
		domain, id = driver, s.Attribute
	}
	var value string
	switch {
	case s.Value.Int != nil:
		value = strconv.FormatInt(*s.Value.Int, 10)
	case s.Value.Bool != nil:
		value = strconv.FormatBool(*s.Value.Bool)
	case s.Value.String != nil:
		value = strconv.Quote(*s.Value.String)
	default:
		t.Fatalf("selector on %s: only int, bool and string values are written as CEL here", s.Attribute)
	}
	expression := fmt.Sprintf("%q in device.attributes[%q] && device.attributes[%q].%s == %s", id, domain, domain, id, value)
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expression}}
}

// The claim as the scheduler reads it: without DRAConsumableCapacity the API server has
// dropped the requests' capacity.
func resourceClaim(t *testing.T, v vectors, c vcase) *resourceapi.ResourceClaim {
	t.Helper()
	spec := resourceapi.DeviceClaim{}
	for _, r := range c.Claim.Requests {
		exactly := &resourceapi.ExactDeviceRequest{
			DeviceClassName: className,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           r.Count,
		}
		for _, s := range r.Selectors {
			exactly.Selectors = append(exactly.Selectors, celSelector(t, v.Driver, s))
		}
		for _, name := range r.HasCapacity {
			expression := fmt.Sprintf("%q in device.capacity[%q]", name, v.Driver)
			exactly.Selectors = append(exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expression}})
		}
		if len(r.Capacity) > 0 && c.ConsumableCapacity {
			exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
			for name, amount := range r.Capacity {
				exactly.Capacity.Requests[resourceapi.QualifiedName(name)] = quantity(t, amount)
			}
		}
		spec.Requests = append(spec.Requests, resourceapi.DeviceRequest{Name: r.Name, Exactly: exactly})
	}
	for _, con := range c.Claim.Constraints {
		attribute := resourceapi.FullyQualifiedName(con.MatchAttribute)
		spec.Constraints = append(spec.Constraints, resourceapi.DeviceConstraint{
			Requests:       con.Requests,
			MatchAttribute: &attribute,
		})
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: types.UID("claim-uid")},
		Spec:       resourceapi.ResourceClaimSpec{Devices: spec},
	}
}

// The allocated state as the scheduler gathers it from allocated claims: with consumable
// capacity a result with a share ID consumes capacity of a shared device; any other result
// holds its device.
func allocatedState(t *testing.T, v vectors, c vcase) structured.AllocatedState {
	t.Helper()
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, results := range c.Allocated {
		for _, r := range results {
			id := structured.MakeDeviceID(v.Driver, r.Pool, r.Device)
			if c.ConsumableCapacity && r.ShareID != nil {
				share := types.UID(*r.ShareID)
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &share))
				consumed := map[resourceapi.QualifiedName]resource.Quantity{}
				for name, amount := range r.ConsumedCapacity {
					consumed[resourceapi.QualifiedName(name)] = quantity(t, amount)
				}
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, consumed))
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

type classes map[string]*resourceapi.DeviceClass

func (l classes) List() ([]*resourceapi.DeviceClass, error) {
	names := make([]string, 0, len(l))
	for name := range l {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]*resourceapi.DeviceClass, 0, len(names))
	for _, name := range names {
		out = append(out, l[name])
	}
	return out, nil
}

func (l classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := l[name]; ok {
		return class, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclass"), name)
}

// TestTheAllocatorAllocatesWhatTheModelDoes runs every case through the upstream allocator
// with the features of a Kubernetes 1.36 scheduler (DRAConsumableCapacity as the case says).
func TestTheAllocatorAllocatesWhatTheModelDoes(t *testing.T) {
	v := load(t)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: className},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", v.Driver)},
		}}},
	}
	lister := classes{className: class}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: v.Pool}}
	allocated, unschedulable := 0, 0
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			features := structured.Features{
				AdminAccess:            true,
				ConsumableCapacity:     c.ConsumableCapacity,
				DeviceBindingAndStatus: true,
				DeviceTaints:           true,
				PartitionableDevices:   true,
				PrioritizedList:        true,
			}
			cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: c.ConsumableCapacity})
			allocator, err := structured.NewAllocator(context.Background(), features, allocatedState(t, v, c),
				lister, []*resourceapi.ResourceSlice{slice(t, v, c)}, cache)
			if err != nil {
				t.Fatalf("NewAllocator: %v", err)
			}
			results, err := allocator.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{resourceClaim(t, v, c)})
			switch {
			case c.Expect.Error != nil:
				if err == nil || !strings.Contains(err.Error(), *c.Expect.Error) {
					t.Fatalf("want an error containing %q, got %v (results %v)", *c.Expect.Error, err, results)
				}
				return
			case err != nil:
				t.Fatalf("Allocate: %v", err)
			case c.Expect.Results == nil:
				if len(results) != 0 {
					t.Fatalf("the model finds no allocation, the allocator finds %s", show(results[0]))
				}
				unschedulable++
				return
			}
			if len(results) != 1 {
				t.Fatalf("the model allocates %v, the allocator finds no allocation", *c.Expect.Results)
			}
			got := results[0].Devices.Results
			want := *c.Expect.Results
			if len(got) != len(want) {
				t.Fatalf("want %v, got %s", want, show(results[0]))
			}
			for i := range want {
				g, w := got[i], want[i]
				if g.Request != w.Request || g.Device != w.Device || (g.ShareID != nil) != w.Shared || g.Driver != v.Driver || g.Pool != v.Pool {
					t.Fatalf("result %d: want %+v, got %s", i, w, show(results[0]))
				}
				if len(g.ConsumedCapacity) != len(w.ConsumedCapacity) {
					t.Fatalf("result %d: want consumed %v, got %s", i, w.ConsumedCapacity, show(results[0]))
				}
				for name, amount := range w.ConsumedCapacity {
					q, ok := g.ConsumedCapacity[resourceapi.QualifiedName(name)]
					if !ok || q.Cmp(quantity(t, amount)) != 0 {
						t.Fatalf("result %d: want %s consumed %s, got %s", i, name, amount, show(results[0]))
					}
				}
			}
			allocated++
		})
	}
	// Both outcomes are covered, or the comparison proves little.
	if allocated < 20 || unschedulable < 10 {
		t.Fatalf("only %d cases allocated and %d did not fit", allocated, unschedulable)
	}
}

func show(r resourceapi.AllocationResult) string {
	parts := make([]string, 0, len(r.Devices.Results))
	for _, d := range r.Devices.Results {
		consumed := make([]string, 0, len(d.ConsumedCapacity))
		for name, q := range d.ConsumedCapacity {
			consumed = append(consumed, fmt.Sprintf("%s=%s", name, q.String()))
		}
		sort.Strings(consumed)
		parts = append(parts, fmt.Sprintf("%s->%s(share %v, %s)", d.Request, d.Device, d.ShareID != nil, strings.Join(consumed, ",")))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// objects reads the multi-document YAML file at path (relative to the repository root) and
// decodes the documents of kind into out, one new element each.
func objects[T any](t *testing.T, path, kind string) []*T {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	var out []*T
	for _, doc := range strings.Split(string(text), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if meta.Kind != kind {
			continue
		}
		obj := new(T)
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			t.Fatalf("%s: %s: %v", path, kind, err)
		}
		out = append(out, obj)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no %s", path, kind)
	}
	return out
}

// TestTheIndividualMemoryExampleAllocatesOnOneNode runs the claim of
// examples/kubernetes/claim-cpus-memory-individual.yaml, with its DeviceClass and the chart's
// (deploy/manifests/resmgr.yaml), through the upstream allocator on the devices of the vector
// case with the same claim: the CEL of both classes compiles and evaluates on CPU and memory
// devices alike, and the claim lands where the model says, memory and CPUs on one NUMA node.
func TestTheIndividualMemoryExampleAllocatesOnOneNode(t *testing.T) {
	v := load(t)
	var c *vcase
	for i := range v.Cases {
		if v.Cases[i].Name == "individual memory and cpus on the one node with both" {
			c = &v.Cases[i]
		}
	}
	if c == nil || c.Expect.Results == nil {
		t.Fatal("the vectors have no allocated individual memory case")
	}
	lister := classes{}
	for _, path := range []string{"deploy/manifests/resmgr.yaml", "examples/kubernetes/claim-cpus-memory-individual.yaml"} {
		for _, class := range objects[resourceapi.DeviceClass](t, path, "DeviceClass") {
			lister[class.Name] = class
		}
	}
	template := objects[resourceapi.ResourceClaimTemplate](t, "examples/kubernetes/claim-cpus-memory-individual.yaml", "ResourceClaimTemplate")[0]
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "example", Namespace: "default", UID: types.UID("example-uid")},
		Spec:       template.Spec.Spec,
	}
	features := structured.Features{ConsumableCapacity: true, DeviceBindingAndStatus: true, PartitionableDevices: true, PrioritizedList: true}
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	allocator, err := structured.NewAllocator(context.Background(), features, allocatedState(t, v, *c),
		lister, []*resourceapi.ResourceSlice{slice(t, v, *c)}, cache)
	if err != nil {
		t.Fatalf("NewAllocator: %v", err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: v.Pool}}
	results, err := allocator.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if len(results) != 1 {
		t.Fatal("the example claim is not allocated")
	}
	got := results[0].Devices.Results
	want := *c.Expect.Results
	if len(got) != len(want) {
		t.Fatalf("want %v, got %s", want, show(results[0]))
	}
	for i := range want {
		if got[i].Request != want[i].Request || got[i].Device != want[i].Device {
			t.Fatalf("result %d: want %+v, got %s", i, want[i], show(results[0]))
		}
	}
}
