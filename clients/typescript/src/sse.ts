/**
 * A small server-sent events parser, following the WHATWG "event stream interpretation" rules:
 * lines end in `\n`, `\r\n` or `\r`; a line starting with `:` is a comment; `field: value` drops
 * one space after the colon; `data` lines are joined with `\n`; a blank line dispatches the frame;
 * a frame without any `data` line is not dispatched.
 *
 * @module
 */

/**
 * The longest line, and the most `data` one frame may carry, in characters: what a hostile or
 * broken server sends is never buffered without bound (the Rust client's bound too).
 */
export const MAX_FRAME = 8 * 1024 * 1024;

/** A line or a frame passed {@link MAX_FRAME}: the stream is not read further. */
export class SseOverflowError extends Error {
  override name = "SseOverflowError";
}

/** One dispatched SSE frame. */
export interface SseFrame {
  /** The `event:` field, `"message"` when absent. */
  event: string;
  /** The `data:` lines joined with `\n`. */
  data: string;
  /** The frame's own `id:` field, if it had one (not inherited from earlier frames). */
  id?: string;
}

/**
 * Incremental line parser: feed it decoded text in arbitrary pieces, get back the frames that
 * completed.
 */
export class SseParser {
  #buffer = "";
  /** The previous piece ended in `\r`: a `\n` starting the next one belongs to that line end. */
  #afterCr = false;
  #event = "";
  #data: string[] = [];
  /** Characters in `#data`, with the newlines that will join them. */
  #dataLength = 0;
  #id: string | undefined;

  /** Parses `text` and returns the frames it completed. */
  push(text: string): SseFrame[] {
    if (text === "") return [];
    if (this.#afterCr && text.startsWith("\n")) text = text.slice(1);
    this.#afterCr = false;
    this.#buffer += text;
    const frames: SseFrame[] = [];
    let start = 0;
    // Positions of the next `\r` and `\n` at or after `start` (-1: none left), each searched
    // again only once passed, so a long piece is scanned in linear time.
    let cr = -2;
    let lf = -2;
    for (;;) {
      if (cr !== -1 && cr < start) cr = this.#buffer.indexOf("\r", start);
      if (lf !== -1 && lf < start) lf = this.#buffer.indexOf("\n", start);
      if (cr < 0 && lf < 0) break;
      let end: number;
      let next: number;
      if (lf >= 0 && (cr < 0 || lf < cr)) {
        end = lf;
        next = lf + 1;
      } else if (cr + 1 < this.#buffer.length) {
        end = cr;
        next = this.#buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
      } else {
        // A trailing `\r`: the line ends here, and a `\n` may follow in the next piece.
        end = cr;
        next = cr + 1;
        this.#afterCr = true;
      }
      const frame = this.#line(this.#buffer.slice(start, end));
      if (frame) frames.push(frame);
      start = next;
    }
    this.#buffer = this.#buffer.slice(start);
    if (this.#buffer.length > MAX_FRAME) {
      throw new SseOverflowError(`an event stream line over ${MAX_FRAME} characters`);
    }
    return frames;
  }

  #line(line: string): SseFrame | undefined {
    if (line === "") return this.#dispatch();
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        this.#event = value;
        break;
      case "data":
        this.#dataLength += value.length + 1;
        if (this.#dataLength > MAX_FRAME) {
          throw new SseOverflowError(`an event stream frame over ${MAX_FRAME} characters`);
        }
        this.#data.push(value);
        break;
      case "id":
        if (!value.includes("\0")) this.#id = value;
        break;
      // `retry` and unknown fields are ignored: reconnection timing is the caller's.
    }
    return undefined;
  }

  #dispatch(): SseFrame | undefined {
    const frame: SseFrame | undefined =
      this.#data.length === 0
        ? undefined
        : {
            event: this.#event || "message",
            data: this.#data.join("\n"),
            ...(this.#id === undefined ? {} : { id: this.#id }),
          };
    this.#event = "";
    this.#data = [];
    this.#dataLength = 0;
    this.#id = undefined;
    return frame;
  }
}

/**
 * Reads SSE frames from a response body. Bytes are decoded as UTF-8 with `stream: true`, so a
 * character split across chunks decodes correctly. A frame cut off by the end of the body is
 * dropped, as the SSE rules require. Errors reading the body propagate.
 */
export async function* readFrames(body: ReadableStream<Uint8Array>): AsyncGenerator<SseFrame> {
  const decoder = new TextDecoder("utf-8");
  const parser = new SseParser();
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      yield* parser.push(decoder.decode(value, { stream: true }));
    }
    yield* parser.push(decoder.decode());
  } finally {
    // Stops the download when the consumer leaves early; harmless after the end.
    await reader.cancel().catch(() => {});
  }
}
