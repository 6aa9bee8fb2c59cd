package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
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
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return nil
	}
	major, minor := (st.Dev>>8)&0xfff|(st.Dev>>32)&^0xfff, st.Dev&0xff|(st.Dev>>12)&^0xff
	read := func() (uint64, bool) {
		f, err := os.Open("/proc/diskstats")
		if err != nil {
			return 0, false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) < 19 || fl[0] != strconv.FormatUint(major, 10) || fl[1] != strconv.FormatUint(minor, 10) {
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
