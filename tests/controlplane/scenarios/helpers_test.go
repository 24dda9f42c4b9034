package scenarios

import (
	"strconv"
	"strings"
)

// cpus expands a kernel cpu list ("0-3,8").
func cpus(list string) map[int]bool {
	out := map[int]bool{}
	for _, part := range strings.Split(list, ",") {
		if part == "" {
			continue
		}
		lo, hi, found := strings.Cut(part, "-")
		a, _ := strconv.Atoi(lo)
		b := a
		if found {
			b, _ = strconv.Atoi(hi)
		}
		for i := a; i <= b; i++ {
			out[i] = true
		}
	}
	return out
}

func overlaps(a, b string) bool {
	bs := cpus(b)
	for c := range cpus(a) {
		if bs[c] {
			return true
		}
	}
	return false
}

// subset reports whether every cpu of a is in b.
func subset(a, b string) bool {
	bs := cpus(b)
	for c := range cpus(a) {
		if !bs[c] {
			return false
		}
	}
	return true
}
