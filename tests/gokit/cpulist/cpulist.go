// Package cpulist reads and compares the kernel's CPU lists ("0-3,8", as in cpuset.cpus and
// /proc/<pid>/status's Cpus_allowed_list), for the Go tests of every module under tests/.
package cpulist

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Set is a set of CPUs.
type Set map[int]bool

// Parse reads a CPU list; an empty one is the empty set. A list that is not one names what is
// wrong: a test should fail on it rather than compare an empty set.
func Parse(list string) (Set, error) {
	out := Set{}
	for _, part := range strings.Split(strings.TrimSpace(list), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("the CPU list %q: %q is not a CPU", list, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("the CPU list %q: %q is not a range", list, part)
			}
		}
		for i := a; i <= b; i++ {
			out[i] = true
		}
	}
	return out, nil
}

// MustParse is Parse for lists a test wrote itself; it panics on a malformed one.
func MustParse(list string) Set {
	s, err := Parse(list)
	if err != nil {
		panic(err)
	}
	return s
}

// Overlaps says whether a and b have a CPU in common.
func (a Set) Overlaps(b Set) bool {
	for c := range a {
		if b[c] {
			return true
		}
	}
	return false
}

// SubsetOf says whether every CPU of a is in b.
func (a Set) SubsetOf(b Set) bool {
	for c := range a {
		if !b[c] {
			return false
		}
	}
	return true
}

// Equal says whether a and b hold the same CPUs.
func (a Set) Equal(b Set) bool { return len(a) == len(b) && a.SubsetOf(b) }

// Minus is the CPUs of a not in b.
func (a Set) Minus(b Set) Set {
	out := Set{}
	for c := range a {
		if !b[c] {
			out[c] = true
		}
	}
	return out
}

// Sorted is the CPUs in increasing order.
func (a Set) Sorted() []int {
	out := make([]int, 0, len(a))
	for c := range a {
		out = append(out, c)
	}
	sort.Ints(out)
	return out
}

// String is the set as the kernel writes it, ranges folded ("0-3,8").
func (a Set) String() string {
	var parts []string
	cpus := a.Sorted()
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
