/** Test tools for the event stream: collecting frames, and a `fetch` that damages connections. */

import type { Event, Frame } from "../../src/index.js";

/**
 * Reads `frames` until `stop` says so and returns them all (the last one included). Throws
 * when the iteration ends first (e.g. its signal timed out).
 */
export async function takeUntil(
  frames: AsyncIterable<Frame>,
  stop: (frame: Frame, seen: Frame[]) => boolean | Promise<boolean>,
): Promise<Frame[]> {
  const seen: Frame[] = [];
  for await (const frame of frames) {
    seen.push(frame);
    if (await stop(frame, seen)) return seen;
  }
  throw new Error(`the event stream ended before the condition held; saw ${describe(seen)}`);
}

/** The durable events among `frames`. */
export function durable(frames: Frame[]): Event[] {
  return frames.flatMap((frame) => (frame.kind === "event" ? [frame.data] : []));
}

export function describe(frames: Frame[]): string {
  return frames
    .map((frame) => (frame.kind === "event" ? `${frame.id}:${frame.data.type}` : frame.kind))
    .join(" ");
}

/** A `fetch` that records each request and lets a test change a connection's request or body. */
export function scriptedFetch(script: {
  /** Replaces connection `n`'s request (0-based). */
  request?: (n: number, request: Request) => Request | Promise<Request>;
  /** Replaces connection `n`'s response, e.g. with an error answer. */
  response?: (n: number, request: Request) => Response | Promise<Response> | undefined;
  /** Wraps connection `n`'s response body. */
  body?: (n: number, body: ReadableStream<Uint8Array>) => ReadableStream<Uint8Array>;
}) {
  const requests: Request[] = [];
  const fetch = async (original: Request): Promise<Response> => {
    const n = requests.length;
    const request = script.request ? await script.request(n, original) : original;
    requests.push(request);
    const replaced = script.response?.(n, request);
    if (replaced) return replaced;
    const response = await globalThis.fetch(request);
    if (!script.body || !response.body) return response;
    return new Response(script.body(n, response.body), {
      status: response.status,
      statusText: response.statusText,
      headers: response.headers,
    });
  };
  return { fetch, requests };
}

/**
 * Passes `body` through until the first occurrence of `marker` (as UTF-8), then ends it with a
 * network-like error one byte into the marker: inside its first character when that is
 * multi-byte.
 */
export function cutInside(marker: string, onCut?: () => void) {
  const needle = new TextEncoder().encode(marker);
  return (body: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> => {
    const reader = body.getReader();
    let pending: Uint8Array = new Uint8Array(0);
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) {
            if (pending.length > 0) controller.enqueue(pending);
            controller.close();
            return;
          }
          pending = concat(pending, value);
          const at = indexOf(pending, needle);
          if (at >= 0) {
            controller.enqueue(pending.slice(0, at + 1));
            controller.error(new TypeError("test: connection reset"));
            onCut?.();
            await reader.cancel().catch(() => {});
            return;
          }
          // Hold back only what may be the start of the marker (a live stream may pause here).
          const keep = partialMatch(pending, needle);
          if (pending.length > keep) {
            controller.enqueue(pending.slice(0, pending.length - keep));
            pending = pending.slice(pending.length - keep);
            return;
          }
        }
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
  };
}

/** Passes `body` through in pieces of 1, 2 and 3 bytes, splitting multi-byte characters. */
export function rechunk(body: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let size = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) {
          controller.close();
          return;
        }
        for (let at = 0; at < value.length; ) {
          size = (size % 3) + 1;
          controller.enqueue(value.slice(at, at + size));
          at += size;
        }
        if (value.length > 0) return;
      }
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** The length of the longest end of `haystack` that starts `needle` (shorter than it). */
function partialMatch(haystack: Uint8Array, needle: Uint8Array): number {
  for (let length = Math.min(haystack.length, needle.length - 1); length > 0; length--) {
    const start = haystack.length - length;
    let matches = true;
    for (let j = 0; j < length && matches; j++) matches = haystack[start + j] === needle[j];
    if (matches) return length;
  }
  return 0;
}

function indexOf(haystack: Uint8Array, needle: Uint8Array): number {
  outer: for (let i = 0; i + needle.length <= haystack.length; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}
