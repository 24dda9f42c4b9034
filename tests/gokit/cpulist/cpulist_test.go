package cpulist

import "testing"

func TestAListReadsBackAsTheKernelWritesIt(t *testing.T) {
	for list, want := range map[string]string{"": "", "3": "3", "0-3,8": "0-3,8", "5,1,2,3\n": "1-3,5", "0-1,1-2": "0-2"} {
		s, err := Parse(list)
		if err != nil {
			t.Fatalf("Parse(%q): %v", list, err)
		}
		if s.String() != want {
			t.Errorf("Parse(%q) is %q, want %q", list, s, want)
		}
	}
}

func TestAMalformedListIsAnErrorNamingIt(t *testing.T) {
	for _, list := range []string{"a", "1-", "3-1", "-2", "1,,x"} {
		if _, err := Parse(list); err == nil {
			t.Errorf("Parse(%q) accepted it", list)
		}
	}
}

func TestSetsCompare(t *testing.T) {
	a, b := MustParse("0-3"), MustParse("2-5")
	if !a.Overlaps(b) || a.Overlaps(MustParse("4-5")) {
		t.Error("Overlaps")
	}
	if !MustParse("1-2").SubsetOf(a) || b.SubsetOf(a) {
		t.Error("SubsetOf")
	}
	if !a.Equal(MustParse("3,2,1,0")) || a.Equal(b) {
		t.Error("Equal")
	}
	if got := a.Minus(b).String(); got != "0-1" {
		t.Errorf("Minus: %q", got)
	}
}
