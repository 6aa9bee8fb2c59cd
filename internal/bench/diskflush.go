package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// diskFlushes returns a reader of the count of flush requests the block
// device holding dir has completed (/proc/diskstats, field 16 after the
// name: Linux 5.5+), or nil where it cannot be read (another OS, a
// device that does not report flushes). Under sync_interval: always every
// fsync of a nats-server store becomes one such request (fewer when the
// filesystem's journal merges concurrent ones), so flushes per turn is the
// durable cost of a turn, as the disk saw it, counted rather than timed. The
// counter is the whole device's: anything else writing to it in the window
// is counted too.
func diskFlushes(dir string) func() (uint64, bool) {
	major, minor, err := deviceOf(dir)
	if err != nil {
		return nil
	}
	read := func() (uint64, bool) {
		f, err := os.Open("/proc/diskstats")
		if err != nil {
			return 0, false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) < 19 || fl[0] != strconv.FormatUint(uint64(major), 10) || fl[1] != strconv.FormatUint(uint64(minor), 10) {
				continue
			}
			n, err := strconv.ParseUint(fl[18], 10, 64)
			return n, err == nil
		}
		return 0, false
	}
	if _, ok := read(); !ok {
		return nil
	}
	return read
}

// deviceOf returns the major and minor number of the device that holds
// dir.
func deviceOf(dir string) (major, minor uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, 0, err
	}
	return unix.Major(st.Dev), unix.Minor(st.Dev), nil
}
