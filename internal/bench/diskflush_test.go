package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
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
	i := 0
	jstest.EventuallyState(t, jstest.Wait, fmt.Sprintf("an fsync raises the flush count above %d", before), func() (bool, string) {
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
		i++
		after, _ := read()
		return after > before, fmt.Sprintf("flush count %d after %d fsyncs", after, i)
	})
}
