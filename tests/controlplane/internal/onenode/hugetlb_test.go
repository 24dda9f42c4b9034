package onenode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestARunGivesBackWhatItReservedAndLeavesOtherRunsPages(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "nr_hugepages")
	if err := os.WriteFile(file, []byte("3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		t.Helper()
		n, err := pageCount(file)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got, err := reserveHugepages(file, a, 4); err != nil || got != 4 {
		t.Fatalf("run a reserved %d (%v), want 4", got, err)
	}
	if got, err := reserveHugepages(file, b, 2); err != nil || got != 2 {
		t.Fatalf("run b reserved %d (%v), want 2", got, err)
	}
	if n := count(); n != 9 {
		t.Fatalf("%d pages after both runs reserved, want 9", n)
	}
	if err := releaseHugepages(file, a); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 5 {
		t.Fatalf("%d pages after run a gave back its own, want 5 (b's stay)", n)
	}
	if _, err := os.Stat(filepath.Join(a, hugepageRecord)); !os.IsNotExist(err) {
		t.Fatalf("run a's record is still there after its release: %v", err)
	}
	// A second release (Down of a run already down) gives nothing back.
	if err := releaseHugepages(file, a); err != nil {
		t.Fatal(err)
	}
	if err := releaseHugepages(file, b); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 3 {
		t.Fatalf("%d pages after both runs gave theirs back, want the 3 from before", n)
	}
}

func TestAPageCountThatIsNotANumberIsNamed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "nr_hugepages")
	if err := os.WriteFile(file, []byte("lots"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := reserveHugepages(file, dir, 1)
	if err == nil || !strings.Contains(err.Error(), `"lots" is not a page count`) {
		t.Fatalf("reserving from a count of \"lots\": %v", err)
	}
}
