// Human approval of tool calls: the mock model always calls an HTTP tool (served by the test,
// which counts its calls) that the agent must ask a person about.

import assert from "node:assert/strict";
import { createServer, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe as suite, test } from "node:test";

import {
  AgenthostError,
  createAgenthost,
  unwrap,
  type Agenthost,
  type Approval,
  type ApprovalDecision,
  type Event,
} from "../src/index.js";
import { startServer, type Server } from "./support/server.js";
import { describe, durable, takeUntil } from "./support/streams.js";

const TIMEOUT = { timeout: 30_000 };

/** One request the HTTP tool received. */
interface ToolCall {
  headers: IncomingHttpHeaders;
  body: { session_id?: string; call_id?: string; name?: string; input?: unknown };
}

/** An HTTP tool on port 0 that answers every call with `{"output": …}` and records it. */
async function startTool(): Promise<{ url: string; calls: ToolCall[]; stop(): Promise<void> }> {
  const calls: ToolCall[] = [];
  const server = createServer((request, response) => {
    let text = "";
    request.setEncoding("utf8");
    request.on("data", (chunk: string) => (text += chunk));
    request.on("end", () => {
      let body: ToolCall["body"] = {};
      try {
        body = JSON.parse(text) as ToolCall["body"];
      } catch {
        // Recorded as `{}`: the assertions on the call say what was wrong.
      }
      calls.push({ headers: request.headers, body });
      response.writeHead(200, { "content-type": "application/json" });
      response.end(JSON.stringify({ output: `found it (call ${calls.length})` }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/lookup`,
    calls,
    stop: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The mock calls a tool whenever it is offered one (and answers in text after its result). */
const config = (url: string) => `
[providers.mock]
kind = "mock"
tool_ratio = 1.0

[models.default]
provider = "mock"

[agents.default]
ask = ["look*"]

[[tools]]
name = "lookup"
kind = "http"
url = "${url}"
idempotent = false
timeout_ms = 10000
description = "Look a thing up"
parameters = { type = "object", properties = { q = { type = "string" } }, required = ["q"] }
`;

suite("approvals", { timeout: 120_000 }, () => {
  let tool: Awaited<ReturnType<typeof startTool>>;
  let server: Server;
  let agenthost: Agenthost;

  before(async () => {
    tool = await startTool();
    server = await startServer({ config: config(tool.url) });
    agenthost = createAgenthost({ baseUrl: server.baseUrl });
  });
  after(async () => {
    await server?.stop();
    await tool?.stop();
  });

  /**
   * Creates a session, prompts it and reads its stream until it waits for the approval: the
   * frames, the `tool_called` and `approval_requested` events, and the listed approval.
   */
  async function untilWaiting(text: string) {
    const { api } = agenthost;
    const session = await unwrap(api.POST("/api/session", { body: {} }));
    const params = { path: { id: session.id } };
    let prompted = false;
    const frames = await takeUntil(
      agenthost.events(session.id, { signal: AbortSignal.timeout(20_000) }),
      async (frame, seen) => {
        if (frame.kind === "synced" && !prompted) {
          prompted = true;
          await unwrap(api.POST("/api/session/{id}/prompt", { params, body: { text } }));
        }
        const requested = durable(seen).some((event) => event.type === "approval_requested");
        return requested && seen.some((f) => f.kind === "status" && f.data.type === "waiting");
      },
    );
    const events = durable(frames);
    const called = events.find((event) => event.type === "tool_called");
    const requested = events.find((event) => event.type === "approval_requested");
    assert.ok(called?.type === "tool_called" && requested?.type === "approval_requested", describe(frames));
    assert.equal(called.name, "lookup");
    assert.equal(requested.id, called.id);
    assert.equal(requested.call_id, called.call_id);
    assert.ok(!events.some((event) => event.type === "tool_started"), "nothing runs before the decision");

    // The session waits, and lists the approval: the call as the model made it.
    const waiting = await unwrap(api.GET("/api/session/{id}", { params }));
    assert.equal(waiting.status.type, "waiting");
    const pending: Approval[] = await unwrap(api.GET("/api/session/{id}/approvals", { params }));
    assert.equal(pending.length, 1, JSON.stringify(pending));
    const approval = pending[0]!;
    assert.deepEqual(approval, {
      message_id: called.id,
      call_id: called.call_id,
      name: "lookup",
      input: called.input,
      digest: requested.digest,
      expires_at: requested.expires_at,
    });
    assert.ok(approval.expires_at > Date.now(), "a day from now by default");
    return { session, params, approval, events };
  }

  /** Every durable event of `session`, replayed. */
  async function replay(session: string): Promise<Event[]> {
    const frames = await takeUntil(
      agenthost.events(session, { signal: AbortSignal.timeout(10_000) }),
      (frame) => frame.kind === "synced",
    );
    return durable(frames);
  }

  test("approved: the call waits, runs exactly once, and a second decision is approval_decided", TIMEOUT, async () => {
    const { api } = agenthost;
    const calls = tool.calls.length;
    const { session, params, approval } = await untilWaiting("Look up the weather, please");
    assert.equal(tool.calls.length, calls, "the tool does not run while the call waits");
    const decideParams = { path: { id: session.id, message_id: approval.message_id, call_id: approval.call_id } };

    // A digest that is not the call's: 409 digest_mismatch, and nothing changes.
    const wrong = await api.POST("/api/session/{id}/approvals/{message_id}/{call_id}", {
      params: decideParams,
      body: { decision: "approve", digest: `${approval.digest}x`, by: "tester" },
    });
    assert.equal(wrong.data, undefined);
    assert.equal(wrong.response.status, 409);
    assert.equal(wrong.error?.error.type, "digest_mismatch");
    assert.deepEqual(await unwrap(api.GET("/api/session/{id}/approvals", { params })), [approval]);
    assert.equal((await unwrap(api.GET("/api/session/{id}", { params }))).status.type, "waiting");

    // The right digest: approved, once.
    const before = Date.now();
    const decision: ApprovalDecision = await unwrap(
      api.POST("/api/session/{id}/approvals/{message_id}/{call_id}", {
        params: decideParams,
        body: { decision: "approve", digest: approval.digest, reason: "looks fine", by: "tester" },
      }),
    );
    assert.equal(decision.decision, "approved");
    assert.equal(decision.by, "tester");
    assert.equal(decision.reason, "looks fine");
    assert.ok(decision.time >= before - 5_000 && decision.time <= Date.now() + 5_000, `time ${decision.time}`);

    const idle = await unwrap(api.POST("/api/session/{id}/wait", { params: { ...params, query: { timeout_ms: 20_000 } } }));
    assert.equal(idle.idle, true);

    // The tool ran exactly once, with the approved call.
    const ran = tool.calls.slice(calls);
    assert.equal(ran.length, 1, JSON.stringify(ran));
    assert.deepEqual(ran[0]!.body, {
      session_id: session.id,
      call_id: approval.call_id,
      name: "lookup",
      input: approval.input,
    });
    assert.equal(ran[0]!.headers["idempotency-key"], `${session.id}/${approval.message_id}/${approval.call_id}`);

    // The log: requested, decided, started, succeeded, then the model's answer.
    const events = await replay(session.id);
    const types = events.map((event) => event.type);
    for (const type of ["approval_requested", "approval_decided", "tool_started", "tool_succeeded", "execution_succeeded"] as const) {
      assert.ok(types.includes(type), `${type} in ${types.join(" ")}`);
    }
    const at = (type: Event["type"]) => types.indexOf(type);
    assert.ok(at("approval_requested") < at("approval_decided"), types.join(" "));
    assert.ok(at("approval_decided") < at("tool_started"), types.join(" "));
    assert.equal(types.filter((type) => type === "tool_started").length, 1, types.join(" "));
    const decided = events.find((event) => event.type === "approval_decided");
    assert.ok(decided?.type === "approval_decided");
    assert.deepEqual(
      { id: decided.id, call_id: decided.call_id, decision: decided.decision, by: decided.by, reason: decided.reason },
      { id: approval.message_id, call_id: approval.call_id, decision: "approved", by: "tester", reason: "looks fine" },
    );
    const succeeded = events.find((event) => event.type === "tool_succeeded");
    assert.ok(succeeded?.type === "tool_succeeded");
    assert.equal(succeeded.output, `found it (call ${calls + 1})`);

    const messages = await unwrap(api.GET("/api/session/{id}/messages", { params }));
    const asked = messages.find((message) => message.id === approval.message_id);
    assert.ok(asked?.type === "assistant", JSON.stringify(messages));
    const part = asked.content.find((p) => p.type === "approval" && p.call_id === approval.call_id);
    assert.ok(part?.type === "approval", JSON.stringify(asked.content));
    assert.deepEqual(part.decision, decision);
    const call = asked.content.find((p) => p.type === "tool" && p.call_id === approval.call_id);
    assert.ok(call?.type === "tool", JSON.stringify(asked.content));
    assert.deepEqual(call.state, { status: "completed", output: succeeded.output, truncated: false });

    const afterwards = await unwrap(api.GET("/api/session/{id}", { params }));
    assert.equal(afterwards.status.type, "idle");
    assert.deepEqual(await unwrap(api.GET("/api/session/{id}/approvals", { params })), []);

    // A second decision (even a different one): 409 approval_decided with the first decision.
    const again = await api.POST("/api/session/{id}/approvals/{message_id}/{call_id}", {
      params: decideParams,
      body: { decision: "deny", digest: approval.digest, reason: "changed my mind", by: "someone else" },
    });
    assert.equal(again.data, undefined);
    assert.equal(again.response.status, 409);
    assert.equal(again.error?.error.type, "approval_decided");
    assert.deepEqual(again.error?.error.decision, decision);
    await assert.rejects(
      unwrap(
        api.POST("/api/session/{id}/approvals/{message_id}/{call_id}", {
          params: decideParams,
          body: { decision: "approve", digest: approval.digest },
        }),
      ),
      (error: unknown) =>
        error instanceof AgenthostError &&
        error.status === 409 &&
        error.type === "approval_decided" &&
        error.decision?.decision === "approved",
    );
    assert.equal(tool.calls.length, calls + 1, "the tool still ran only once");
    assert.equal((await replay(session.id)).length, events.length, "nothing was written");
  });

  test("denied: the tool never runs and the model gets the refusal", TIMEOUT, async () => {
    const { api } = agenthost;
    const calls = tool.calls.length;
    const { session, params, approval } = await untilWaiting("Look up something you should not");
    const decision = await unwrap(
      api.POST("/api/session/{id}/approvals/{message_id}/{call_id}", {
        params: { path: { id: session.id, message_id: approval.message_id, call_id: approval.call_id } },
        body: { decision: "deny", digest: approval.digest, reason: "not today", by: "tester" },
      }),
    );
    assert.equal(decision.decision, "denied");
    const idle = await unwrap(api.POST("/api/session/{id}/wait", { params: { ...params, query: { timeout_ms: 20_000 } } }));
    assert.equal(idle.idle, true);
    assert.equal(tool.calls.length, calls, "a denied call never runs");

    const types = (await replay(session.id)).map((event) => event.type);
    assert.ok(types.includes("approval_decided"), types.join(" "));
    assert.ok(!types.includes("tool_started"), types.join(" "));
    assert.ok(types.includes("execution_succeeded"), types.join(" "));
    assert.equal((await unwrap(api.GET("/api/session/{id}", { params }))).status.type, "idle");

    // The call's message keeps the decision; its result, which the model saw, is the refusal.
    const messages = await unwrap(api.GET("/api/session/{id}/messages", { params }));
    const asked = messages.find((message) => message.id === approval.message_id);
    assert.ok(asked?.type === "assistant", JSON.stringify(messages));
    const part = asked.content.find((p) => p.type === "approval" && p.call_id === approval.call_id);
    assert.ok(part?.type === "approval", JSON.stringify(asked.content));
    assert.deepEqual(part.decision, decision);
    const call = asked.content.find((p) => p.type === "tool" && p.call_id === approval.call_id);
    assert.ok(call?.type === "tool", JSON.stringify(asked.content));
    assert.ok(call.state.status === "error", JSON.stringify(call.state));
    assert.match(call.state.error, /denied by tester: not today/);
    assert.equal(messages.at(-1)?.type, "assistant", "the model answered after the refusal");
  });
});
