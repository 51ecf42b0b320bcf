// The typed API against a real `agenthost serve` with a mock provider.

import assert from "node:assert/strict";
import { after, before, describe as suite, test } from "node:test";

import { AgenthostError, createAgenthost, unwrap, type Agenthost } from "../src/index.js";
import { startServer, type Server } from "./support/server.js";
import { describe, durable, scriptedFetch, takeUntil } from "./support/streams.js";

const TIMEOUT = { timeout: 30_000 };

// The mock streams its reply a token at a time, as a model does: deltas the provider has ready
// together reach the stream joined, so a reply ready all at once would come as one delta.
const CONFIG = `
[providers.mock]
kind = "mock"
tokens_per_sec = 2000

[models.default]
provider = "mock"
`;

suite("api", { timeout: 120_000 }, () => {
  let server: Server;
  let agenthost: Agenthost;

  before(async () => {
    server = await startServer({ config: CONFIG });
    agenthost = createAgenthost({ baseUrl: server.baseUrl });
  });
  after(async () => {
    await server?.stop();
  });

  test("a session: create, prompt, stream until idle, read messages", TIMEOUT, async () => {
    const { api } = agenthost;
    const session = await unwrap(api.POST("/api/session", { body: { title: "ünïcode title" } }));
    assert.match(session.id, /^ses_/);
    assert.equal(session.title, "ünïcode title");

    const text = "What changed since yesterday? héllo 🌍 日本語";
    let receipt: { id: string; admitted_seq: number } | undefined;
    let succeeded = false;
    const frames = await takeUntil(
      agenthost.events(session.id, { signal: AbortSignal.timeout(20_000) }),
      async (frame) => {
        if (frame.kind === "synced" && receipt === undefined) {
          receipt = await unwrap(
            api.POST("/api/session/{id}/prompt", { params: { path: { id: session.id } }, body: { text } }),
          );
        }
        if (frame.kind === "event" && frame.data.type === "execution_succeeded") succeeded = true;
        return succeeded && frame.kind === "status" && frame.data.type === "idle";
      },
    );
    assert.ok(receipt, describe(frames));

    // Durable events: contiguous seqs from 0, `id` equal to `seq`, the turn's events in order.
    const events = durable(frames);
    assert.deepEqual(
      events.map((event) => event.seq),
      events.map((_, i) => i),
    );
    for (const frame of frames) if (frame.kind === "event") assert.equal(frame.id, frame.data.seq);
    const types = events.map((event) => event.type);
    for (const type of ["session_created", "prompt_admitted", "prompt_promoted", "step_started", "text_ended", "step_ended", "execution_succeeded"] as const) {
      assert.ok(types.includes(type), `${type} in ${types.join(" ")}`);
    }
    const admitted = events.find((event) => event.type === "prompt_admitted");
    assert.ok(admitted?.type === "prompt_admitted");
    assert.equal(admitted.text, text);
    assert.equal(admitted.seq, receipt.admitted_seq);
    assert.equal(admitted.id, receipt.id);

    // The text deltas add up to the durable text.
    const ended = events.find((event) => event.type === "text_ended");
    assert.ok(ended?.type === "text_ended");
    const deltas = frames.flatMap((frame) =>
      frame.kind === "delta" && frame.data.message_id === ended.id && frame.data.kind === "text" ? [frame.data.delta] : [],
    );
    assert.ok(deltas.length > 1, "the mock streams several deltas");
    assert.equal(deltas.join(""), ended.text);
    assert.ok(frames.some((frame) => frame.kind === "status" && frame.data.type === "running"));

    // Messages: the user's and the assistant's.
    const messages = await unwrap(api.GET("/api/session/{id}/messages", { params: { path: { id: session.id } } }));
    const user = messages.find((message) => message.type === "user");
    const assistant = messages.find((message) => message.type === "assistant");
    assert.ok(user?.type === "user" && assistant?.type === "assistant");
    assert.equal(user.text, text);
    assert.equal(assistant.id, ended.id);
    assert.deepEqual(assistant.content, [{ type: "text", text: ended.text, incomplete: false }]);
    assert.equal(assistant.finish, "stop");

    const after = await unwrap(api.GET("/api/session/{id}", { params: { path: { id: session.id } } }));
    assert.equal(after.status.type, "idle");
    assert.equal(after.last_seq, events.at(-1)!.seq);
    assert.equal(after.pending, 0);
  });

  test("wait and generate: generate records nothing", TIMEOUT, async () => {
    const { api } = agenthost;
    const session = await unwrap(api.POST("/api/session", { body: {} }));
    const path = { path: { id: session.id } };
    await unwrap(api.POST("/api/session/{id}/prompt", { params: path, body: { text: "Start" } }));
    const idle = await unwrap(api.POST("/api/session/{id}/wait", { params: { ...path, query: { timeout_ms: 20_000 } } }));
    assert.equal(idle.idle, true);
    const before = await unwrap(api.GET("/api/session/{id}", { params: path }));

    const generated = await unwrap(
      api.POST("/api/session/{id}/generate", { params: path, body: { prompt: "Summarize where we left off" } }),
    );
    assert.equal(typeof generated.text, "string");
    assert.ok(generated.text.length > 0);

    const afterwards = await unwrap(api.GET("/api/session/{id}", { params: path }));
    assert.equal(afterwards.last_seq, before.last_seq);
    const messages = await unwrap(api.GET("/api/session/{id}/messages", { params: path }));
    assert.deepEqual(
      messages.map((message) => message.type),
      ["user", "assistant"],
    );
  });

  test("an exact prompt retry returns the original receipt; a different one is prompt_conflict", TIMEOUT, async () => {
    const { api } = agenthost;
    const session = await unwrap(api.POST("/api/session", { body: {} }));
    const params = { path: { id: session.id } };
    const id = "msg_client_test_1";
    const first = await unwrap(api.POST("/api/session/{id}/prompt", { params, body: { id, text: "once", resume: false } }));
    const again = await unwrap(api.POST("/api/session/{id}/prompt", { params, body: { id, text: "once", resume: false } }));
    assert.deepEqual(again, first);
    await assert.rejects(
      unwrap(api.POST("/api/session/{id}/prompt", { params, body: { id, text: "twice", resume: false } })),
      (error: unknown) => error instanceof AgenthostError && error.status === 409 && error.type === "prompt_conflict",
    );
  });

  test("errors are typed: 404 session_not_found, 400 invalid_request", TIMEOUT, async () => {
    const { api } = agenthost;
    // The raw openapi-fetch result: `error` is typed as the error envelope.
    const { data, error, response } = await api.GET("/api/session/{id}", { params: { path: { id: "ses_missing" } } });
    assert.equal(data, undefined);
    assert.equal(response.status, 404);
    assert.equal(error?.error.type, "session_not_found");

    await assert.rejects(
      unwrap(api.GET("/api/session/{id}", { params: { path: { id: "ses_missing" } } })),
      (error: unknown) => {
        assert.ok(error instanceof AgenthostError);
        assert.equal(error.status, 404);
        assert.equal(error.type, "session_not_found");
        assert.match(error.message, /ses_missing/);
        return true;
      },
    );
    // A path id that cannot be a session's names none: a 404 too, saying why.
    await assert.rejects(
      unwrap(api.POST("/api/session/{id}/wait", { params: { path: { id: "nope" } } })),
      (error: unknown) =>
        error instanceof AgenthostError && error.status === 404 && error.type === "session_not_found" && /missing prefix/.test(error.message),
    );
    const session = await unwrap(api.POST("/api/session", { body: {} }));
    await assert.rejects(
      unwrap(api.POST("/api/session/{id}/prompt", { params: { path: { id: session.id } }, body: { text: "" } })),
      (error: unknown) => error instanceof AgenthostError && error.status === 400 && error.type === "invalid_request",
    );
    await assert.rejects(
      unwrap(api.POST("/api/session/{id}/wait", { params: { path: { id: session.id }, query: { timeout_ms: 10_000_000 } } })),
      (error: unknown) => error instanceof AgenthostError && error.status === 400 && error.type === "invalid_request",
    );
  });

  test("the event stream throws 4xx at once, without retrying", TIMEOUT, async () => {
    const { fetch, requests } = scriptedFetch({});
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    for (const [id, status, type] of [
      ["ses_missing", 404, "session_not_found"],
      ["nope", 404, "session_not_found"],
    ] as const) {
      requests.length = 0;
      await assert.rejects(
        takeUntil(client.events(id, { backoff: { initialMs: 1 } }), () => true),
        (error: unknown) => error instanceof AgenthostError && error.status === status && error.type === type,
      );
      assert.equal(requests.length, 1, `${id}: one request`);
    }
  });

  test("a non-envelope error answer is unexpected_response", TIMEOUT, async () => {
    const client = createAgenthost({
      baseUrl: server.baseUrl,
      fetch: async () => new Response("<html>bad gateway</html>", { status: 418 }),
    });
    await assert.rejects(
      unwrap(client.api.GET("/api/session", {})),
      (error: unknown) => error instanceof AgenthostError && error.status === 418 && error.type === "unexpected_response",
    );
  });
});

suite("bearer token", { timeout: 60_000 }, () => {
  let server: Server;
  before(async () => {
    server = await startServer({ env: { AGENTHOST_TOKEN: "s3cret-token" } });
  });
  after(async () => {
    await server?.stop();
  });

  test("without the token: 401 unauthorized, on the API and the stream", TIMEOUT, async () => {
    const anonymous = createAgenthost({ baseUrl: server.baseUrl });
    await assert.rejects(
      unwrap(anonymous.api.POST("/api/session", { body: {} })),
      (error: unknown) => error instanceof AgenthostError && error.status === 401 && error.type === "unauthorized",
    );
    await assert.rejects(
      takeUntil(anonymous.events("ses_whatever"), () => true),
      (error: unknown) => error instanceof AgenthostError && error.status === 401,
    );
  });

  test("with the token: the API and the stream work", TIMEOUT, async () => {
    const client = createAgenthost({ baseUrl: `${server.baseUrl}/`, token: "s3cret-token" });
    const session = await unwrap(client.api.POST("/api/session", { body: {} }));
    const frames = await takeUntil(
      client.events(session.id, { signal: AbortSignal.timeout(10_000) }),
      (frame) => frame.kind === "synced",
    );
    assert.deepEqual(
      frames.map((frame) => frame.kind),
      ["event", "synced"],
    );
  });
});
