/**
 * A typed client for the agenthost HTTP+SSE API.
 *
 * ```ts
 * const agenthost = createAgenthost({ baseUrl: "http://127.0.0.1:4096" });
 * const session = await unwrap(agenthost.api.POST("/api/session", { body: {} }));
 * for await (const frame of agenthost.events(session.id)) { … }
 * ```
 *
 * `api` is an [openapi-fetch](https://openapi-ts.dev/openapi-fetch/) client typed from the
 * server's OpenAPI document (`schema.d.ts`); `events` reads a session's event stream with
 * resumption; `unwrap` turns a response into its `data` or throws an {@link AgenthostError}.
 *
 * @module
 */

import createClient, { type Client } from "openapi-fetch";

import type { components, paths } from "./schema.js";
import { readFrames, SseOverflowError } from "./sse.js";

export type { components, operations, paths } from "./schema.js";
export { MAX_FRAME, readFrames, SseOverflowError, SseParser, type SseFrame } from "./sse.js";

type Schemas = components["schemas"];

/** A durable event: its `type` names the kind, `seq` is its position in the session's log. */
export type Event = Schemas["Event"];
/** The `type` of a durable event. */
export type EventType = Event["type"];
/** A streamed fragment of an assistant part; the durable `*_ended` event is authoritative. */
export type Delta = Schemas["Delta"];
/** Whether a drain is running in the server process that serves the stream. */
export type Status = Schemas["Status"];
/** The replay is complete; live events follow. */
export type Synced = Schemas["Synced"];
/** The body of an error response or `error` frame. */
export type ErrorBody = Schemas["ErrorBody"];
/** The stable `type` of an error. */
export type ErrorType = Schemas["ErrorType"];
export type Session = Schemas["Session"];
export type Message = Schemas["Message"];
/** A tool call waiting for a person's decision (`GET /api/session/{id}/approvals`). */
export type Approval = Schemas["Approval"];
/** A decision on an approval: the answer of deciding one, and `error.decision` of a 409 `approval_decided`. */
export type ApprovalDecision = Schemas["ApprovalDecision"];

/** One frame of a session's event stream, as {@link Agenthost.events} yields it. */
export type Frame =
  /** A durable event; `id` is its seq (the SSE `id:`), equal to `data.seq`. */
  | { kind: "event"; id: number; data: Event }
  /** Sent after each (re)connection's replay. */
  | { kind: "synced"; data: Synced }
  | { kind: "delta"; data: Delta }
  | { kind: "status"; data: Status }
  /** The server could not read the store, or this client fell too far behind; it ends the stream after this (and `events` reconnects). */
  | { kind: "error"; data: ErrorBody };

/** An error answer of the API: the HTTP status and the `{error: {type, message}}` envelope. */
export class AgenthostError extends Error {
  override name = "AgenthostError";

  constructor(
    /** The HTTP status. */
    readonly status: number,
    /**
     * The error's stable `type`, or `"unexpected_response"` when the body was not an agenthost
     * error envelope (a proxy's error page, say).
     */
    readonly type: ErrorType | "unexpected_response",
    message: string,
    /** The `x-request-id` the server logged the error under, when it sent one. */
    readonly requestId?: string,
    /** With `approval_decided`: the decision that was made first, and stands. */
    readonly decision?: ApprovalDecision,
  ) {
    super(message);
  }

  /** Builds the error from a status and a (parsed or raw) response body. */
  static from(status: number, body: unknown, requestId?: string): AgenthostError {
    const error = (body as { error?: unknown } | null)?.error as Partial<ErrorBody> | undefined;
    if (typeof error?.type === "string" && typeof error.message === "string") {
      return new AgenthostError(status, error.type, error.message, requestId, error.decision ?? undefined);
    }
    const text = typeof body === "string" ? body : JSON.stringify(body);
    return new AgenthostError(
      status,
      "unexpected_response",
      `HTTP ${status}: ${(text ?? "").slice(0, 200)}`,
      requestId,
    );
  }
}

/**
 * Awaits an `api` call and returns its payload (the `data` of `{"data": …}`), or throws an
 * {@link AgenthostError} for an error answer.
 *
 * ```ts
 * const receipt = await unwrap(api.POST("/api/session/{id}/prompt", {
 *   params: { path: { id } }, body: { text: "hello" },
 * }));
 * ```
 */
export async function unwrap<T>(
  call: Promise<
    | { data: { data: T }; error?: never; response: Response }
    | { data?: never; error: unknown; response: Response }
  >,
): Promise<T> {
  const { data, error, response } = await call;
  if (data === undefined) {
    throw AgenthostError.from(response.status, error, response.headers.get("x-request-id") ?? undefined);
  }
  return data.data;
}

/** Options of {@link createAgenthost}. */
export interface AgenthostOptions {
  /** The server's root, e.g. `http://127.0.0.1:4096` (without `/api`). */
  baseUrl: string;
  /** The bearer token, when the server has one configured. */
  token?: string;
  /** A `fetch` to use instead of the global one (for tests, proxies, instrumentation). */
  fetch?: (request: Request) => Promise<Response>;
}

/** Options of {@link Agenthost.events}. */
export interface EventsOptions {
  /** Start after this seq (replay everything when absent). */
  after?: number;
  /** Aborting ends the iteration (without an error) and closes the connection. */
  signal?: AbortSignal;
  /**
   * Reconnection attempts in a row that may fail before `events` gives up and throws (default
   * 10; `Infinity` never gives up). The count starts over once a connection makes progress
   * (delivers a new durable event or `synced`).
   */
  maxRetries?: number;
  /**
   * The delay before reconnection attempt `n` (0-based) is a random value between half and all
   * of `min(maxMs, initialMs * 2^n)`. Defaults: 250 ms and 10 s.
   */
  backoff?: { initialMs?: number; maxMs?: number };
}

/** The client {@link createAgenthost} returns. */
export interface Agenthost {
  /** The typed openapi-fetch client of every route. */
  api: Client<paths>;
  /**
   * The session's event stream: durable events from seq 0 (or after `after`), a `synced` frame
   * once the replay is complete and a `status` frame with the session's state at that moment,
   * then live durable events, deltas and status changes.
   *
   * Opening the stream throws an {@link AgenthostError} for an error answer: 4xx at once
   * (`session_not_found`, `invalid_request`, `unauthorized`), 5xx once the retries are used up.
   *
   * A dropped connection, a network error or the server ending the stream (it does so when it
   * shuts down or after an `error` frame) is followed by a reconnection, with exponential
   * backoff, sending `Last-Event-ID` with the seq of the last durable event yielded: no
   * durable event is yielded twice or skipped (a repeated one is dropped; a gap in the seqs is
   * treated as a dropped connection). Each reconnection yields a new `synced` and the current
   * `status`. Deltas that were sent while disconnected are lost (they are not durable): the
   * durable events that follow are authoritative.
   *
   * The server's stream never ends on its own (it sends keep-alives while nothing happens), so
   * neither does the iteration: leave it with `break`/`return`, or abort `signal`. Either closes
   * the connection.
   */
  events(sessionId: string, options?: EventsOptions): AsyncGenerator<Frame, void, undefined>;
}

/** Creates a client of the agenthost server at `baseUrl`. */
export function createAgenthost(options: AgenthostOptions): Agenthost {
  const baseUrl = options.baseUrl.replace(/\/+$/, "");
  const fetcher = options.fetch ?? ((request: Request) => globalThis.fetch(request));
  const api = createClient<paths>({ baseUrl, fetch: fetcher });
  const token = options.token;
  if (token !== undefined) {
    api.use({
      onRequest({ request }) {
        request.headers.set("authorization", `Bearer ${token}`);
        return request;
      },
    });
  }
  return {
    api,
    events: (sessionId, eventsOptions = {}) =>
      streamEvents({ baseUrl, fetcher, token }, sessionId, eventsOptions),
  };
}

/** The frames that carry no `id:` and are not durable events. */
const EPHEMERAL = new Set(["synced", "delta", "status", "error"]);

/** Why a connection of {@link streamEvents} ended, when it did not end by abort. */
class Dropped extends Error {
  override name = "Dropped";
}

async function* streamEvents(
  client: { baseUrl: string; fetcher: (request: Request) => Promise<Response>; token?: string },
  sessionId: string,
  options: EventsOptions,
): AsyncGenerator<Frame, void, undefined> {
  const maxRetries = options.maxRetries ?? 10;
  const initialMs = options.backoff?.initialMs ?? 250;
  const maxMs = options.backoff?.maxMs ?? 10_000;
  const url = `${client.baseUrl}/api/session/${encodeURIComponent(sessionId)}/events`;
  // The seq of the last durable event yielded (or the caller's starting point).
  let last = options.after;
  // Our own controller, so leaving the loop early also closes the connection.
  const controller = new AbortController();
  const onAbort = () => controller.abort(options.signal?.reason);
  options.signal?.addEventListener("abort", onAbort, { once: true });
  if (options.signal?.aborted) onAbort();
  const signal = controller.signal;
  let failures = 0;
  try {
    for (;;) {
      if (signal.aborted) return;
      let failure: unknown;
      try {
        const headers = new Headers({ accept: "text/event-stream" });
        if (client.token !== undefined) headers.set("authorization", `Bearer ${client.token}`);
        if (last !== undefined) headers.set("last-event-id", String(last));
        const response = await client.fetcher(new Request(url, { headers, signal }));
        if (!response.ok) {
          const text = await response.text().catch(() => "");
          let body: unknown = text;
          try {
            body = JSON.parse(text);
          } catch {
            // Not JSON: AgenthostError says so.
          }
          const error = AgenthostError.from(
            response.status,
            body,
            response.headers.get("x-request-id") ?? undefined,
          );
          if (response.status < 500) throw error;
          failure = error;
        } else if (!response.body) {
          failure = new Dropped("the event stream response has no body");
        } else {
          for await (const raw of readFrames(response.body)) {
            if (raw.id !== undefined) {
              const id = Number(raw.id);
              if (!Number.isSafeInteger(id) || id < 0) throw new Dropped(`malformed event id ${raw.id}`);
              const expected = last === undefined ? 0 : last + 1;
              if (id < expected) continue; // Already yielded: drop it.
              if (id > expected) throw new Dropped(`event seq ${id} follows ${last ?? "nothing"}`);
              const data = JSON.parse(raw.data) as Event;
              last = id;
              failures = 0;
              yield { kind: "event", id, data };
            } else if (EPHEMERAL.has(raw.event)) {
              const frame = { kind: raw.event, data: JSON.parse(raw.data) } as Frame;
              if (frame.kind === "synced") failures = 0;
              yield frame;
            }
            // Anything else is a frame kind this client does not know yet: skipped.
          }
          failure = new Dropped("the server ended the event stream");
        }
      } catch (error) {
        if (signal.aborted) return;
        // An error answer, or a server sending frames past the bound: reconnecting would not help.
        if (error instanceof AgenthostError || error instanceof SseOverflowError) throw error;
        failure = error;
      }
      if (failures >= maxRetries) {
        if (failure instanceof AgenthostError) throw failure;
        throw new Error(
          `event stream of ${sessionId}: giving up after ${failures} reconnection attempts`,
          { cause: failure },
        );
      }
      const ceiling = Math.min(maxMs, initialMs * 2 ** failures);
      failures += 1;
      await sleep(ceiling / 2 + (Math.random() * ceiling) / 2, signal);
    }
  } finally {
    options.signal?.removeEventListener("abort", onAbort);
    controller.abort();
  }
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
