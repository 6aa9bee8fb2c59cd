"""Starts a real `tollgate dev` for the tests: random loopback ports, a
temporary data directory, the dev key read from it.

The binary is $TOLLGATE_BIN (`make test` builds it), else it is built once
per process with `go build ./cmd/tollgate` from this repository."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[3]
_built: Optional[str] = None


def tollgate_bin() -> str:
    global _built
    env = os.environ.get("TOLLGATE_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise RuntimeError(f"TOLLGATE_BIN={env} is not an executable")
        return env
    if _built is None:
        out = os.path.join(tempfile.mkdtemp(prefix="tollgate-bin-"), "tollgate")
        subprocess.run(["go", "build", "-o", out, "./cmd/tollgate"], cwd=ROOT, check=True)
        _built = out
    return _built


def _ephemeral_low() -> Optional[int]:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    """A loopback port that was free a moment ago, for tollgate dev to listen
    on. It is chosen below the kernel's ephemeral range where Linux names it:
    a port bound with 0 comes from that range, which outgoing connections
    draw their local ports from too, so one could take it before tollgate
    dev starts (seen in CI: "bind: address already in use")."""
    low = _ephemeral_low()
    if low is not None and low > 11000:
        for _ in range(64):
            port = random.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(RuntimeError):
    """tollgate dev could not bind a port chosen for it: another process
    took it after free_port found it free."""


class DevServer:
    """One `tollgate dev` process. ``url`` is its gateway, ``key`` the dev
    key (transport ``gateway``, every scope, vouching), ``data`` its data
    directory (the sandbox is ``data/sandbox``)."""

    def __init__(self, policy: Optional[dict] = None, webhooks: Optional[dict] = None) -> None:
        # The ports are chosen free a moment before tollgate dev binds them,
        # and the other test processes of `make test` choose theirs from the
        # same range: one may take a port in between ("bind: address already
        # in use", seen in CI). Such a start is tried again on new ports; any
        # other failure is the test's.
        for attempt in range(3):
            try:
                self._start(policy, webhooks)
                return
            except PortTaken:
                if attempt == 2:
                    raise

    def _start(self, policy: Optional[dict], webhooks: Optional[dict]) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="tollgate-dev-")
        self.data = Path(self.tmp.name) / "data"
        http_port = free_port()
        self.url = f"http://127.0.0.1:{http_port}"
        args = [tollgate_bin(), "dev", "--data", str(self.data),
                "--listen", f"127.0.0.1:{free_port()}", "--http", f"127.0.0.1:{http_port}",
                "--metrics", f"127.0.0.1:{free_port()}", "--discord-http", "", "--log-level", "warn"]
        if policy is not None:
            p = Path(self.tmp.name) / "policy.json"
            p.write_text(json.dumps(policy))
            args += ["--policy", str(p)]
        if webhooks is not None:
            w = Path(self.tmp.name) / "webhooks.json"
            w.write_text(json.dumps(webhooks))
            args += ["--webhooks", str(w)]
        # Only the flags above configure it: no TOLLGATE_* of the caller's environment.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
        self.log = open(Path(self.tmp.name) / "dev.log", "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            self.key = self._ready(30.0)
        except BaseException:
            self.stop()
            raise

    def _ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        key_file = self.data / "gateway-dev-key"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.output()
                if "address already in use" in out:
                    raise PortTaken(out)
                raise RuntimeError(f"tollgate dev exited {self.proc.returncode}:\n{out}")
            if key_file.exists():
                try:
                    with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                        if r.status == 200:
                            return key_file.read_text().strip()
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"tollgate dev not ready in {timeout}s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return (Path(self.tmp.name) / "dev.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.tmp.cleanup()


def eventually(what: str, cond, timeout: float = 15.0):
    """Polls cond() until it returns a true value (returned), or fails
    naming what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)  # well under the key's rate (20 requests/s)
