// The SSE parser on its own, without a server.

import assert from "node:assert/strict";
import { test } from "node:test";

import { MAX_FRAME, readFrames, SseOverflowError, SseParser, type SseFrame } from "../src/sse.js";

function parse(...pieces: string[]): SseFrame[] {
  const parser = new SseParser();
  return pieces.flatMap((piece) => parser.push(piece));
}

function body(...chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
}

async function collect(stream: ReadableStream<Uint8Array>): Promise<SseFrame[]> {
  const frames: SseFrame[] = [];
  for await (const frame of readFrames(stream)) frames.push(frame);
  return frames;
}

const expected: SseFrame[] = [
  { event: "step_started", data: '{"seq":4}', id: "4" },
  { event: "delta", data: "a\nb" },
];

test("lines may end in LF, CRLF or CR", { timeout: 5_000 }, () => {
  for (const eol of ["\n", "\r\n", "\r"]) {
    const text = ["event: step_started", 'data: {"seq":4}', "id: 4", "", "event: delta", "data: a", "data: b", "", ""]
      .join(eol);
    assert.deepEqual(parse(text), expected, JSON.stringify(eol));
    // Every split point, a CR and its LF in different pieces included.
    for (let i = 0; i <= text.length; i++) {
      assert.deepEqual(parse(text.slice(0, i), text.slice(i)), expected, `${JSON.stringify(eol)} split at ${i}`);
    }
  }
});

test("a CR at the end of a piece, then an empty piece, then its LF, is one line end", { timeout: 5_000 }, () => {
  assert.deepEqual(parse("data: x\r", "", "\n\r\n"), [{ event: "message", data: "x" }]);
});

test("comments, field forms, and frames without data", { timeout: 5_000 }, () => {
  const text = [
    ": keep-alive",
    "event: only-event", // no data: not dispatched
    "",
    "data:no-space",
    "data:  two spaces",
    "data",
    ": a comment inside a frame",
    "retry: 1000",
    "unknown: field",
    "",
    "id: 7",
    "data: {}",
    "",
    "data: after",
    "",
    "",
  ].join("\n");
  assert.deepEqual(parse(text), [
    { event: "message", data: "no-space\n two spaces\n" },
    { event: "message", data: "{}", id: "7" },
    // `id` is the frame's own: an ephemeral frame after a durable one has none.
    { event: "message", data: "after" },
  ]);
});

test("a frame cut off by the end of the body is dropped", { timeout: 5_000 }, async () => {
  const encoder = new TextEncoder();
  const frames = await collect(body(encoder.encode("data: whole\n\ndata: cut")));
  assert.deepEqual(frames, [{ event: "message", data: "whole" }]);
});

test("UTF-8 split across chunks decodes, at every byte boundary", { timeout: 10_000 }, async () => {
  const text = "event: prompt_admitted\ndata: {\"text\":\"héllo 🌍 日本語\"}\nid: 1\n\n";
  const bytes = new TextEncoder().encode(text);
  const want = [{ event: "prompt_admitted", data: '{"text":"héllo 🌍 日本語"}', id: "1" }];
  for (let i = 0; i <= bytes.length; i++) {
    assert.deepEqual(await collect(body(bytes.slice(0, i), bytes.slice(i))), want, `split at ${i}`);
  }
  // One byte at a time.
  const single = Array.from(bytes, (byte) => Uint8Array.of(byte));
  assert.deepEqual(await collect(body(...single)), want);
});

test("a line or a frame over the bound stops the parser", () => {
  // One endless line, fed in pieces.
  const parser = new SseParser();
  parser.push("data: ");
  const piece = "x".repeat(1024 * 1024);
  assert.throws(() => {
    for (let i = 0; i <= MAX_FRAME / piece.length + 1; i++) parser.push(piece);
  }, SseOverflowError);
  // Many short data lines adding up to too much for one frame.
  const lines = new SseParser();
  const line = `data: ${"y".repeat(64 * 1024)}\n`;
  assert.throws(() => {
    for (let i = 0; i <= MAX_FRAME / line.length + 1; i++) lines.push(line);
  }, SseOverflowError);
  // Just under the bound is fine.
  const big = new SseParser();
  assert.equal(big.push(`data: ${"z".repeat(MAX_FRAME - 16)}\n\n`).length, 1);
});
