package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// lockFileName is the file in the data dir that `tollgate dev` locks.
const lockFileName = "tollgate.lock"

// errLocked is tryLock's answer when another process holds the lock.
var errLocked = errors.New("locked by another process")

// lockHolder is what the lock file says about the process holding it.
type lockHolder struct {
	PID    int    `json:"pid"`
	Listen string `json:"listen"`
}

// lockDataDir claims the data dir dir for this process: an exclusive lock
// on dir/tollgate.lock (flock, on unix), taken without waiting, after which
// it writes this process's pid and listen address into the file. If another
// process holds the lock it fails at once, with an error naming that
// process as its lock file describes it. The lock is released by release,
// or by the operating system when the process exits, however it exits.
func lockDataDir(dir, listen string) (release func(), err error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	if err := tryLock(f); err != nil {
		defer f.Close()
		if !errors.Is(err, errLocked) {
			return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
		}
		return nil, fmt.Errorf("data dir %s is in use by %s (lock file %s): stop it, or give this one another --data",
			dir, describeHolder(f), path)
	}
	b, _ := json.Marshal(lockHolder{PID: os.Getpid(), Listen: listen})
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(append(b, '\n'), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock data dir: write %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// describeHolder names the process whose details are in lock file f.
func describeHolder(f *os.File) string {
	var h lockHolder
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil || json.Unmarshal(b, &h) != nil || h.PID == 0 {
		return "another process"
	}
	return fmt.Sprintf("tollgate dev pid %d listening on %s", h.PID, h.Listen)
}

// checkListen fails, naming addr, when nothing can listen on addr (another
// tollgate dev or nats-server has it), so that `tollgate dev` says so at
// once rather than waiting for an embedded server that cannot start. A port
// of 0 or less is not checked: nats-server chooses it.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if p, _ := strconv.Atoi(port); err != nil || p <= 0 {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s (is another tollgate dev or nats-server using it? give this one another --listen): %w", addr, err)
	}
	return ln.Close()
}
