/**
 * Starts a real `agenthost serve` for the tests: a temporary data directory, port 0, the URL
 * read from its "listening" line. The binary is `$AGENTHOST_BIN`, by default the workspace's
 * debug build (`../../target/debug/agenthost` from `clients/typescript`).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** `clients/typescript`, from `dist/test/support/server.js`. */
const packageDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");

export const binary = process.env.AGENTHOST_BIN
  ? path.resolve(process.env.AGENTHOST_BIN)
  : path.resolve(packageDir, "../../target/debug/agenthost");

export interface Server {
  baseUrl: string;
  /** Stops the server (SIGTERM, then SIGKILL after 5 s) and removes its data directory. */
  stop(): Promise<void>;
}

export interface ServerOptions {
  /** The text of a configuration file. */
  config?: string;
  /** Extra environment variables (e.g. `AGENTHOST_TOKEN`). */
  env?: Record<string, string>;
}

export async function startServer(options: ServerOptions = {}): Promise<Server> {
  const dir = await mkdtemp(path.join(tmpdir(), "agenthost-ts-"));
  const args = ["serve", "--bind", "127.0.0.1:0", "--data-dir", path.join(dir, "data")];
  if (options.config !== undefined) {
    const file = path.join(dir, "agenthost.toml");
    await writeFile(file, options.config);
    args.push("--config", file);
  }
  const env: NodeJS.ProcessEnv = { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "warn" };
  delete env.AGENTHOST_TOKEN;
  delete env.AGENTHOST_CONFIG;
  Object.assign(env, options.env);
  const child = spawn(binary, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    stderr = (stderr + chunk).slice(-8192);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  try {
    const baseUrl = await listening(child, () => stderr);
    return {
      baseUrl,
      async stop() {
        await stopChild(child, exited);
        await rm(dir, { recursive: true, force: true });
      },
    };
  } catch (error) {
    await stopChild(child, exited);
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
}

/** Resolves with the URL of the "agenthost listening on URL" line, or rejects within 30 s. */
function listening(child: ChildProcess, stderr: () => string): Promise<string> {
  return new Promise((resolve, reject) => {
    let stdout = "";
    const fail = (why: string) => {
      clearTimeout(timer);
      reject(new Error(`agenthost serve (${binary}) ${why}\nstderr:\n${stderr()}`));
    };
    const timer = setTimeout(() => fail("did not print its listening line within 30 s"), 30_000);
    child.once("error", (error) => fail(`could not start: ${error.message}`));
    child.once("exit", (code, signal) => fail(`exited early (code ${code}, signal ${signal})`));
    child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
      stdout += chunk;
      const match = /agenthost listening on (http:\/\/\S+)/.exec(stdout);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]!);
      }
    });
  });
}

async function stopChild(child: ChildProcess, exited: Promise<void>): Promise<void> {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  child.kill("SIGTERM");
  const timeout = new Promise<"timeout">((resolve) => setTimeout(() => resolve("timeout"), 5_000).unref());
  if ((await Promise.race([exited, timeout])) === "timeout") {
    child.kill("SIGKILL");
    await exited;
  }
}
