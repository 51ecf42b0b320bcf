// The event stream helper: resumption, damaged connections, retries, abort.

import assert from "node:assert/strict";
import { after, before, describe as suite, test } from "node:test";

import { AgenthostError, createAgenthost, unwrap, type Agenthost, type Event, type Frame } from "../src/index.js";
import { startServer, type Server } from "./support/server.js";
import { cutInside, describe, durable, rechunk, scriptedFetch, takeUntil } from "./support/streams.js";

const TIMEOUT = { timeout: 30_000 };
const FAST = { initialMs: 5, maxMs: 50 };

/** Prompts with unique multi-byte markers, to cut connections inside a known character. */
const PROMPTS = ["first ① — héllo", "second ② — 🌍 日本語", "third ③ — ünïcode ✓"];

suite("events", { timeout: 180_000 }, () => {
  let server: Server;
  let agenthost: Agenthost;
  let session: string;
  /** Every durable event of `session`, read once without damage. */
  let reference: Event[];

  const untilLast = (frame: Frame) => frame.kind === "synced" && frame.data.last_seq === reference.at(-1)!.seq;

  before(async () => {
    server = await startServer();
    agenthost = createAgenthost({ baseUrl: server.baseUrl });
    const { api } = agenthost;
    session = (await unwrap(api.POST("/api/session", { body: {} }))).id;
    const params = { path: { id: session } };
    for (const text of PROMPTS) {
      await unwrap(api.POST("/api/session/{id}/prompt", { params, body: { text } }));
      const { idle } = await unwrap(api.POST("/api/session/{id}/wait", { params: { ...params, query: { timeout_ms: 20_000 } } }));
      assert.ok(idle);
    }
    const frames = await takeUntil(
      agenthost.events(session, { signal: AbortSignal.timeout(10_000) }),
      (frame) => frame.kind === "synced",
    );
    reference = durable(frames);
    assert.deepEqual(
      reference.map((event) => event.seq),
      reference.map((_, i) => i),
    );
    assert.equal(reference.filter((event) => event.type === "prompt_admitted").length, PROMPTS.length);
  });
  after(async () => {
    await server?.stop();
  });

  /** The seq of the `prompt_admitted` event of `PROMPTS[i]`. */
  const admittedSeq = (i: number) =>
    reference.find((event) => event.type === "prompt_admitted" && event.text === PROMPTS[i])!.seq;

  test("`after` resumes after the given seq", TIMEOUT, async () => {
    for (const from of [0, 3, reference.length - 2]) {
      const frames = await takeUntil(
        agenthost.events(session, { after: from, signal: AbortSignal.timeout(10_000) }),
        (frame) => frame.kind === "synced",
      );
      assert.deepEqual(durable(frames), reference.slice(from + 1), `after ${from}`);
      assert.deepEqual(frames.at(-1), { kind: "synced", data: { last_seq: reference.at(-1)!.seq } });
    }
  });

  test("a connection cut inside a multi-byte character resumes with Last-Event-ID: no gap, no duplicate", TIMEOUT, async () => {
    let cuts = 0;
    const { fetch, requests } = scriptedFetch({
      body: (n, body) => (n < 2 ? cutInside(n === 0 ? "②" : "③", () => cuts++)(body) : body),
    });
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    const frames = await takeUntil(client.events(session, { backoff: FAST, signal: AbortSignal.timeout(20_000) }), untilLast);
    assert.equal(cuts, 2);
    assert.deepEqual(durable(frames), reference, describe(frames));
    // The first connection yielded everything before the second prompt's admission, the
    // second everything before the third's; each reconnection said so.
    assert.deepEqual(
      requests.map((request) => request.headers.get("last-event-id")),
      [null, String(admittedSeq(1) - 1), String(admittedSeq(2) - 1)],
    );
    // The cut connections never reached `synced`; the last one did.
    assert.equal(frames.filter((frame) => frame.kind === "synced").length, 1);
  });

  test("a body split into 1-3 byte chunks decodes the same", TIMEOUT, async () => {
    const { fetch } = scriptedFetch({ body: (_, body) => rechunk(body) });
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    const frames = await takeUntil(client.events(session, { signal: AbortSignal.timeout(20_000) }), untilLast);
    assert.deepEqual(durable(frames), reference);
    const texts = durable(frames).flatMap((event) => (event.type === "prompt_admitted" ? [event.text] : []));
    assert.deepEqual(texts, PROMPTS);
  });

  test("events a reconnection repeats are dropped", TIMEOUT, async () => {
    // The reconnection loses its Last-Event-ID, so the server replays from the start.
    const { fetch, requests } = scriptedFetch({
      request: (n, request) => {
        if (n === 0) return request;
        const headers = new Headers(request.headers);
        headers.delete("last-event-id");
        return new Request(request, { headers });
      },
      body: (n, body) => (n === 0 ? cutInside("③")(body) : body),
    });
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    const frames = await takeUntil(client.events(session, { backoff: FAST, signal: AbortSignal.timeout(20_000) }), untilLast);
    assert.equal(requests.length, 2);
    assert.equal(requests[1]!.headers.get("last-event-id"), null);
    assert.deepEqual(durable(frames), reference, describe(frames));
  });

  test("a gap in the seqs is treated as a dropped connection", TIMEOUT, async () => {
    // The second connection skips three events; the client notices and reconnects.
    const { fetch, requests } = scriptedFetch({
      request: (n, request) => {
        if (n !== 1) return request;
        const headers = new Headers(request.headers);
        headers.set("last-event-id", String(Number(headers.get("last-event-id")) + 3));
        return new Request(request, { headers });
      },
      body: (n, body) => (n === 0 ? cutInside("②")(body) : body),
    });
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    const frames = await takeUntil(client.events(session, { backoff: FAST, signal: AbortSignal.timeout(20_000) }), untilLast);
    assert.deepEqual(durable(frames), reference, describe(frames));
    assert.equal(requests.length, 3);
    assert.equal(requests[2]!.headers.get("last-event-id"), String(admittedSeq(1) - 1));
  });

  test("a live stream cut mid-turn resumes with every durable event", TIMEOUT, async () => {
    const { api } = agenthost;
    const id = (await unwrap(api.POST("/api/session", { body: {} }))).id;
    let cuts = 0;
    const { fetch, requests } = scriptedFetch({
      body: (n, body) => (n === 0 ? cutInside('"type":"text_ended"', () => cuts++)(body) : body),
    });
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    let prompted = false;
    const frames = await takeUntil(
      client.events(id, { backoff: FAST, signal: AbortSignal.timeout(20_000) }),
      async (frame) => {
        if (frame.kind === "synced" && !prompted) {
          prompted = true;
          await unwrap(api.POST("/api/session/{id}/prompt", { params: { path: { id } }, body: { text: "live 🌍" } }));
        }
        return frame.kind === "event" && frame.data.type === "execution_succeeded";
      },
    );
    assert.equal(cuts, 1);
    assert.equal(requests.length, 2);
    const replay = durable(
      await takeUntil(agenthost.events(id, { signal: AbortSignal.timeout(10_000) }), (frame) => frame.kind === "synced"),
    );
    assert.deepEqual(durable(frames), replay, describe(frames));
    assert.equal(replay.at(-1)!.type, "execution_succeeded");
  });

  test("retries are limited, with the last failure as the cause", TIMEOUT, async () => {
    const { fetch, requests } = scriptedFetch({
      response: () => {
        throw new TypeError("test: network down");
      },
    });
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    await assert.rejects(
      takeUntil(client.events(session, { maxRetries: 3, backoff: FAST }), () => true),
      (error: unknown) => {
        assert.ok(error instanceof Error);
        assert.match(error.message, /giving up after 3 reconnection attempts/);
        assert.ok(error.cause instanceof TypeError);
        return true;
      },
    );
    assert.equal(requests.length, 4);
  });

  test("5xx answers are retried; once the retries are used up the error is thrown", TIMEOUT, async () => {
    const unavailable = () =>
      Response.json({ error: { type: "unavailable", message: "too many event streams open" } }, { status: 503 });
    // Two 503s, then the real server.
    const flaky = scriptedFetch({ response: (n) => (n < 2 ? unavailable() : undefined) });
    const frames = await takeUntil(
      createAgenthost({ baseUrl: server.baseUrl, fetch: flaky.fetch }).events(session, {
        backoff: FAST,
        signal: AbortSignal.timeout(10_000),
      }),
      untilLast,
    );
    assert.deepEqual(durable(frames), reference);
    assert.equal(flaky.requests.length, 3);

    const down = scriptedFetch({ response: unavailable });
    await assert.rejects(
      takeUntil(
        createAgenthost({ baseUrl: server.baseUrl, fetch: down.fetch }).events(session, { maxRetries: 2, backoff: FAST }),
        () => true,
      ),
      (error: unknown) => error instanceof AgenthostError && error.status === 503 && error.type === "unavailable",
    );
    assert.equal(down.requests.length, 3);
  });

  test("aborting the signal ends the iteration without an error, also while waiting for live events", TIMEOUT, async () => {
    const controller = new AbortController();
    const started = Date.now();
    const seen: Frame[] = [];
    for await (const frame of agenthost.events(session, { signal: controller.signal })) {
      seen.push(frame);
      if (frame.kind === "synced") setTimeout(() => controller.abort(), 100);
    }
    assert.deepEqual(durable(seen), reference);
    assert.ok(Date.now() - started < 5_000);
    // An already aborted signal yields nothing.
    const none: Frame[] = [];
    for await (const frame of agenthost.events(session, { signal: AbortSignal.abort() })) none.push(frame);
    assert.deepEqual(none, []);
  });

  test("leaving the loop closes the connection", TIMEOUT, async () => {
    let cancelled = 0;
    const { fetch } = scriptedFetch({
      body: (_, body) => {
        const reader = body.getReader();
        return new ReadableStream<Uint8Array>({
          async pull(controller) {
            const { done, value } = await reader.read();
            if (done) controller.close();
            else controller.enqueue(value);
          },
          cancel(reason) {
            cancelled++;
            return reader.cancel(reason);
          },
        });
      },
    });
    const client = createAgenthost({ baseUrl: server.baseUrl, fetch });
    for await (const frame of client.events(session)) {
      if (frame.kind === "synced") break;
    }
    assert.equal(cancelled, 1);
  });
});
