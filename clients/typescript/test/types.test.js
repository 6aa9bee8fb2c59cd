// The client's types cannot drift from the gateway's OpenAPI document:
// src/openapi.d.ts must be exactly what openapi-typescript generates from
// transport/gateway/openapi.json (`npm run generate` rewrites it), and the
// declarations (src/index.d.ts) and a program written against them must
// type-check with it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const spec = resolve(here, "..", "..", "transport", "gateway", "openapi.json");
const bin = (pkg, file) => {
  const p = join(here, "node_modules", pkg, "bin", file);
  assert.ok(existsSync(p), `${p} is missing: run \`npm ci\` in clients/typescript (make test-deps)`);
  return p;
};

test("src/openapi.d.ts is what openapi-typescript generates from openapi.json", () => {
  // The arguments of `npm run generate`, with another output file.
  const out = join(mkdtempSync(join(tmpdir(), "tollgate-types-")), "openapi.d.ts");
  const [cmd, ...args] = JSON.parse(readFileSync(join(here, "package.json"), "utf8")).scripts.generate.split(/\s+/);
  assert.equal(cmd, "openapi-typescript");
  const o = args.indexOf("--output");
  assert.ok(o > 0 && resolve(here, args[0]) === spec, `generate: ${args.join(" ")}`);
  args[o + 1] = out;
  execFileSync(process.execPath, [bin("openapi-typescript", "cli.js"), ...args], { cwd: here, stdio: "pipe" });
  assert.ok(readFileSync(out, "utf8") === readFileSync(join(here, "src", "openapi.d.ts"), "utf8"),
    "src/openapi.d.ts differs from transport/gateway/openapi.json: run `npm run generate` in clients/typescript");
});

test("the declarations type-check against the generated types", () => {
  try {
    execFileSync(process.execPath, [bin("typescript", "tsc"), "-p", here], { cwd: here, stdio: "pipe" });
  } catch (e) {
    assert.fail(`tsc: ${e.stdout}${e.stderr}`);
  }
});
