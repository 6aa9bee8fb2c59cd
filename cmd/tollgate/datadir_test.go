//go:build unix

package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestDataDirLockNamesItsHolder(t *testing.T) {
	dir := t.TempDir()
	release, err := lockDataDir(dir, "127.0.0.1:4222")
	if err != nil {
		t.Fatal(err)
	}
	holder := "pid " + strconv.Itoa(os.Getpid()) + " listening on 127.0.0.1:4222"

	t.Run("a second lock on the same dir fails naming the holder", func(t *testing.T) {
		_, err := lockDataDir(dir, "127.0.0.1:4333")
		if err == nil || !strings.Contains(err.Error(), holder) {
			t.Fatalf("second lock: %v; want an error naming %q", err, holder)
		}
	})

	t.Run("a second tollgate dev on another port stops before it opens the store", func(t *testing.T) {
		code, _, errOut := runCLI(t, "dev", "--data", dir, "--listen", "127.0.0.1:4333", "--metrics", "")
		if code != 1 || !strings.Contains(errOut, holder) {
			t.Fatalf("exit %d, stderr %q; want 1 and the holder %q", code, errOut, holder)
		}
		if _, err := os.Stat(filepath.Join(dir, "jetstream")); !os.IsNotExist(err) {
			t.Fatalf("the refused dev touched the JetStream store: %v", err)
		}
	})

	t.Run("once released the dir can be locked again", func(t *testing.T) {
		release()
		again, err := lockDataDir(dir, "127.0.0.1:4333")
		if err != nil {
			t.Fatalf("lock after release: %v", err)
		}
		again()
	})
}

func TestDevSaysWhichListenAddressIsTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	if err := checkListen(addr); err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("checkListen(%s) = %v; want an error naming the address", addr, err)
	}
	code, _, errOut := runCLI(t, "dev", "--data", t.TempDir(), "--listen", addr, "--metrics", "")
	if code != 1 || !strings.Contains(errOut, "cannot listen on "+addr) {
		t.Fatalf("exit %d, stderr %q; want 1 and the address %s named", code, errOut, addr)
	}
}
