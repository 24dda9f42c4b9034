package scenarios

import "github.com/resmgr/resmgr/tests/gokit/cpulist"

// cpus expands a kernel cpu list ("0-3,8"); a malformed one panics, failing the test.
func cpus(list string) cpulist.Set { return cpulist.MustParse(list) }

func overlaps(a, b string) bool { return cpus(a).Overlaps(cpus(b)) }

// subset reports whether every cpu of a is in b.
func subset(a, b string) bool { return cpus(a).SubsetOf(cpus(b)) }
