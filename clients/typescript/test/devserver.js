// Starts a real `tollgate dev` for the tests: random loopback ports, a
// temporary data directory, the dev key read from it. The binary is
// $TOLLGATE_BIN (`make test` builds it), else it is built once with
// `go build ./cmd/tollgate` from this repository.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, existsSync, rmSync, openSync, closeSync, accessSync, constants } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
let built;

export function tollgateBin() {
  const env = process.env.TOLLGATE_BIN;
  if (env) {
    accessSync(env, constants.X_OK);
    return env;
  }
  if (!built) {
    built = join(mkdtempSync(join(tmpdir(), "tollgate-bin-")), "tollgate");
    execFileSync("go", ["build", "-o", built, "./cmd/tollgate"], { cwd: ROOT, stdio: "inherit" });
  }
  return built;
}

function listenOnce(port) {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(port, "127.0.0.1", () => {
      const { port: got } = s.address();
      s.close(() => res(got));
    });
  });
}

// A loopback port that was free a moment ago, for tollgate dev to listen on.
// It is chosen below the kernel's ephemeral range where Linux names it: a
// port bound with 0 comes from that range, which outgoing connections draw
// their local ports from too, so one could take it before tollgate dev starts.
export async function freePort() {
  let low;
  try {
    low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
  } catch {
    low = undefined;
  }
  if (low > 11000) {
    for (let i = 0; i < 64; i++) {
      const port = 10000 + Math.floor(Math.random() * (low - 10000));
      try {
        return await listenOnce(port);
      } catch {
        // taken: try another
      }
    }
  }
  return listenOnce(0);
}

/** Polls cond until it returns a truthy value (returned), or throws naming what was awaited. */
export async function eventually(what, cond, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100)); // well under the key's rate (20 requests/s)
  }
}

/**
 * One `tollgate dev`: `url` its gateway, `key` the dev key, `data` its data directory.
 * The ports are chosen free a moment before tollgate dev binds them, and the other
 * test processes of `make test` choose theirs from the same range: one may take a
 * port in between ("bind: address already in use"). Such a start is tried again on
 * new ports; any other failure is the test's.
 */
export async function startDev(opts = {}) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await startDevOnce(opts);
    } catch (e) {
      if (attempt === 2 || !String(e.message).includes("address already in use")) throw e;
    }
  }
}

async function startDevOnce({ policy, webhooks } = {}) {
  const tmp = mkdtempSync(join(tmpdir(), "tollgate-dev-"));
  const data = join(tmp, "data");
  const httpPort = await freePort();
  const url = `http://127.0.0.1:${httpPort}`;
  const args = ["dev", "--data", data, "--listen", `127.0.0.1:${await freePort()}`, "--http", `127.0.0.1:${httpPort}`,
    "--metrics", `127.0.0.1:${await freePort()}`, "--discord-http", "", "--log-level", "warn"];
  if (policy) {
    writeFileSync(join(tmp, "policy.json"), JSON.stringify(policy));
    args.push("--policy", join(tmp, "policy.json"));
  }
  if (webhooks) {
    writeFileSync(join(tmp, "webhooks.json"), JSON.stringify(webhooks));
    args.push("--webhooks", join(tmp, "webhooks.json"));
  }
  // Only the flags above configure it: no TOLLGATE_* of the caller's environment.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TOLLGATE_")));
  const logFile = join(tmp, "dev.log");
  const fd = openSync(logFile, "w");
  const proc = spawn(tollgateBin(), args, { env, stdio: ["ignore", fd, fd] });
  closeSync(fd);
  let exited = null;
  proc.on("exit", (code) => { exited = code ?? -1; });
  const output = () => readFileSync(logFile, "utf8");
  const stop = async () => {
    if (exited === null) {
      const gone = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
      await gone;
      clearTimeout(t);
    }
    rmSync(tmp, { recursive: true, force: true });
  };
  const keyFile = join(data, "gateway-dev-key");
  try {
    await eventually("tollgate dev to serve", async () => {
      if (exited !== null) throw new Error(`tollgate dev exited ${exited}:\n${output()}`);
      if (!existsSync(keyFile)) return false;
      try {
        return (await fetch(url + "/healthz")).ok;
      } catch {
        return false;
      }
    }, 30_000);
  } catch (e) {
    await stop();
    throw e;
  }
  return { url, key: readFileSync(keyFile, "utf8").trim(), data, output, stop };
}
