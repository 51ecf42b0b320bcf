// Interrupting a turn in flight, with a slow mock provider.

import assert from "node:assert/strict";
import { after, before, describe as suite, test } from "node:test";

import { createAgenthost, unwrap, type Agenthost } from "../src/index.js";
import { startServer, type Server } from "./support/server.js";
import { describe, durable, takeUntil } from "./support/streams.js";

// 20 tokens a second, 2000 tokens: a turn takes 100 s unless interrupted.
const CONFIG = `
[providers.slow]
kind = "mock"
tokens_per_sec = 20
reply_tokens = 2000

[models.default]
provider = "slow"
`;

suite("interrupt", { timeout: 90_000 }, () => {
  let server: Server;
  let agenthost: Agenthost;

  before(async () => {
    server = await startServer({ config: CONFIG });
    agenthost = createAgenthost({ baseUrl: server.baseUrl });
  });
  after(async () => {
    await server?.stop();
  });

  test("interrupt stops the running turn and keeps its partial output", { timeout: 30_000 }, async () => {
    const { api } = agenthost;
    const session = await unwrap(api.POST("/api/session", { body: {} }));
    const params = { path: { id: session.id } };
    let prompted = false;
    let interrupted: boolean | undefined;
    const frames = await takeUntil(
      agenthost.events(session.id, { signal: AbortSignal.timeout(20_000) }),
      async (frame, seen) => {
        if (frame.kind === "synced" && !prompted) {
          prompted = true;
          await unwrap(api.POST("/api/session/{id}/prompt", { params, body: { text: "Write a long essay" } }));
        }
        // A few deltas in: the turn is in flight.
        if (interrupted === undefined && seen.filter((f) => f.kind === "delta").length === 3) {
          const running = await unwrap(api.GET("/api/session/{id}", { params }));
          assert.equal(running.status.type, "running");
          const waited = await unwrap(api.POST("/api/session/{id}/wait", { params: { ...params, query: { timeout_ms: 50 } } }));
          assert.equal(waited.idle, false);
          ({ interrupted } = await unwrap(api.POST("/api/session/{id}/interrupt", { params })));
        }
        return frame.kind === "event" && frame.data.type === "execution_interrupted";
      },
    );
    assert.equal(interrupted, true, describe(frames));
    const events = durable(frames);
    const last = events.at(-1)!;
    assert.ok(last.type === "execution_interrupted");
    assert.equal(last.reason, "user");
    assert.ok(!events.some((event) => event.type === "execution_succeeded"));

    const idle = await unwrap(api.GET("/api/session/{id}", { params }));
    assert.equal(idle.status.type, "idle");
    assert.equal(idle.claimed, false);

    // The assistant message keeps what was streamed, marked incomplete.
    const streamed = frames.flatMap((frame) => (frame.kind === "delta" ? [frame.data.delta] : [])).join("");
    const messages = await unwrap(api.GET("/api/session/{id}/messages", { params }));
    const assistant = messages.find((message) => message.type === "assistant");
    assert.ok(assistant?.type === "assistant");
    const part = assistant.content[0];
    assert.ok(part?.type === "text", JSON.stringify(assistant));
    assert.equal(part.incomplete, true);
    assert.ok(part.text.length > 0 && streamed.startsWith(part.text), `${JSON.stringify(part.text)} vs ${JSON.stringify(streamed)}`);
    assert.equal(assistant.error?.kind, "aborted");

    // Interrupting an idle session is not an error.
    const again = await unwrap(api.POST("/api/session/{id}/interrupt", { params }));
    assert.equal(again.interrupted, false);
  });
});
