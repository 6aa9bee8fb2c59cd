package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// diskFlushes counts the flushes of the disk a directory lives on: an
// fsync of a file written there raises the count. Where it finds no
// counter (an overlay or tmpfs directory has no block device of its own),
// /proc/diskstats has no line for the directory's device.
func TestDiskFlushesCountsAnFsync(t *testing.T) {
	dir := t.TempDir()
	read := diskFlushes(dir)
	if read == nil {
		major, minor, err := deviceOf(dir)
		if err != nil {
			t.Fatal(err)
		}
		stats, err := os.ReadFile("/proc/diskstats")
		if err == nil && strings.Contains(string(stats), fmt.Sprintf(" %d %d ", major, minor)) {
			t.Fatalf("no flush counter for %s, but /proc/diskstats lists its device %d:%d", dir, major, minor)
		}
		return
	}
	before, ok := read()
	if !ok {
		t.Fatal("the counter could not be read a second time")
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("x"); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if after, _ := read(); after > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("flush count still %d after %d fsyncs", before, i+1)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
