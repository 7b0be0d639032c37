// A real fpa-serve on loopback ports for the OpenAI client tests; always killed at the end.
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const SERVE_BIN = process.env.FPA_SERVE_BIN ?? path.join(REPO, "build/server/fpa-serve");
export const MODEL = path.join(REPO, "tests/vectors/fpa_free");
export const MODEL_NAME = "fpa_free";

export async function startServer(...flags) {
  const proc = spawn(SERVE_BIN, [
    "--model", MODEL, "--address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
    "--http-address", "127.0.0.1:0", "--threads", "1", "--cache-pages", "16384",
    "--max-new-tokens", "100000", ...flags,
  ], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`fpa-serve did not start:\n${log}`)), 60000);
    const read = (data) => {
      log += data;
      const m = log.match(/:(\d+) \(http\)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    };
    proc.stdout.on("data", read);
    proc.stderr.on("data", read);
    proc.on("exit", (code) => reject(new Error(`fpa-serve exited with ${code}:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  return {
    proc,
    base,
    log: () => log,
    async metrics() {
      const text = await (await fetch(`${base}/metrics`)).text();
      const out = {};
      for (const line of text.split("\n")) {
        if (line && !line.startsWith("#")) {
          const i = line.lastIndexOf(" ");
          out[line.slice(0, i)] = Number(line.slice(i + 1));
        }
      }
      return out;
    },
    stop() {
      if (proc.exitCode === null) proc.kill("SIGKILL");
    },
  };
}

// Polls `probe` until it returns true, for at most `ms`.
export async function eventually(probe, ms = 10000) {
  const deadline = Date.now() + ms;
  while (!(await probe())) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}
