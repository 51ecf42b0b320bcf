//! An incremental server-sent-events decoder, written here rather than taken from an SSE client
//! library because those reconnect by re-sending the POST, which duplicates generations.
//!
//! It follows the WHATWG event-stream rules that matter for a single POST response: lines end
//! with `\r\n`, `\n` or `\r` (a `\r\n` split across chunks counts once); `:` lines are comments;
//! `data:` lines accumulate joined by `\n`; `event:` names the frame; `id:` sets the last event
//! id, which persists across frames (a value holding NUL is ignored) and is what a reconnecting
//! client sends back as `Last-Event-ID`; `retry` is ignored; one space after the colon is dropped;
//! a leading BOM is skipped. Lines are decoded only once complete, so a UTF-8 character split across network
//! chunks is reassembled. Unlike a browser, [`Decoder::finish`] dispatches a final frame that
//! lacks its blank line, as some servers end that way.
//!
//! A line or a frame longer than [`MAX_FRAME`] bytes stops the decoder ([`Decoder::overflowed`]):
//! what a hostile or broken server sends is never buffered without bound.

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The `event:` name, empty when none was given.
    pub event: String,
    /// The `data:` lines joined by `\n`.
    pub data: String,
    /// The `id:` this frame itself gave, if any. (The SSE "last event id", which persists
    /// across frames, is [`Decoder::last_event_id`].)
    pub id: Option<String>,
}

/// Incremental decoder: feed it chunks in order, then call [`Decoder::finish`] at end of input.
#[derive(Debug)]
pub struct Decoder {
    /// Bytes of an incomplete line carried over from earlier chunks.
    line: Vec<u8>,
    /// The previous chunk ended with `\r`; a leading `\n` in the next one belongs to it.
    skip_lf: bool,
    /// Still at the start of the stream (where a BOM may appear).
    at_start: bool,
    event: String,
    data: String,
    /// The last `id:` seen; not reset between frames.
    last_id: String,
    /// The pending frame gave an `id:`.
    frame_has_id: bool,
    /// At least one `data` line arrived for the pending frame (an empty `data:` still counts).
    has_data: bool,
    /// A line or a frame passed [`MAX_FRAME`]: nothing more is decoded.
    overflowed: bool,
}

const BOM: &[u8] = "\u{feff}".as_bytes();

/// The longest event id kept; a longer one is ignored (ids are sequence numbers here).
const MAX_ID: usize = 256;

fn frame(event: &str, data: &str, id: Option<&str>) -> Frame {
    Frame {
        event: event.to_owned(),
        data: data.to_owned(),
        id: id.map(str::to_owned),
    }
}

/// The longest line, and the most `data` one frame may carry, in bytes. Real frames are a few
/// hundred bytes; a whole tool input in one frame stays far below this.
pub const MAX_FRAME: usize = 8 * 1024 * 1024;

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self {
            line: Vec::new(),
            skip_lf: false,
            at_start: true,
            event: String::new(),
            data: String::new(),
            last_id: String::new(),
            frame_has_id: false,
            has_data: false,
            overflowed: false,
        }
    }

    /// Whether a line or a frame passed [`MAX_FRAME`]; the decoder then ignores the rest of the
    /// stream, and the caller should fail it.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    fn overflow(&mut self) {
        self.overflowed = true;
        // Give the memory back at once.
        self.line = Vec::new();
        self.data = String::new();
        self.event = String::new();
        self.has_data = false;
    }

    /// The last event id the stream gave (empty when none).
    pub fn last_event_id(&self) -> &str {
        &self.last_id
    }

    /// Decodes `chunk`, appending every completed frame to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Frame>) {
        self.feed_frames(chunk, &mut |event, data, id| {
            out.push(frame(event, data, id))
        });
    }

    /// Ends the input, appending the last frames to `out` (see [`Decoder::finish_with`]).
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        self.finish_frames(&mut |event, data, id| out.push(frame(event, data, id)));
    }

    /// Decodes `chunk`, calling `on_frame(event, data)` for every completed frame. The strings
    /// are lent from the decoder's reused buffers, so decoding allocates nothing per frame.
    pub fn feed_with(&mut self, chunk: &[u8], mut on_frame: impl FnMut(&str, &str)) {
        self.feed_frames(chunk, &mut |event, data, _| on_frame(event, data));
    }

    /// Ends the input: a trailing line without its line ending is processed, and a pending
    /// frame without its blank line is dispatched.
    pub fn finish_with(&mut self, mut on_frame: impl FnMut(&str, &str)) {
        self.finish_frames(&mut |event, data, _| on_frame(event, data));
    }

    fn feed_frames(
        &mut self,
        mut chunk: &[u8],
        on_frame: &mut impl FnMut(&str, &str, Option<&str>),
    ) {
        if self.overflowed {
            return;
        }
        if self.skip_lf && !chunk.is_empty() {
            self.skip_lf = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        if self.at_start {
            // Wait until three bytes exist to decide about a BOM split across chunks.
            if self.line.len() + chunk.len() < BOM.len() {
                self.line.extend_from_slice(chunk);
                return;
            }
            self.at_start = false;
            if !self.line.is_empty() {
                let mut head = std::mem::take(&mut self.line);
                head.extend_from_slice(chunk);
                let head = head.strip_prefix(BOM).unwrap_or(&head).to_vec();
                return self.feed_lines(&head, on_frame);
            }
            chunk = chunk.strip_prefix(BOM).unwrap_or(chunk);
        }
        self.feed_lines(chunk, on_frame);
    }

    fn feed_lines(
        &mut self,
        mut chunk: &[u8],
        on_frame: &mut impl FnMut(&str, &str, Option<&str>),
    ) {
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            if self.line.is_empty() {
                self.line_complete(&chunk[..end], on_frame);
            } else {
                self.line.extend_from_slice(&chunk[..end]);
                let line = std::mem::take(&mut self.line);
                self.line_complete(&line, on_frame);
                // Keep the allocation for the next partial line.
                self.line = line;
                self.line.clear();
            }
            let mut next = end + 1;
            if chunk[end] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            chunk = &chunk[next..];
            if self.overflowed {
                return;
            }
        }
        if self.line.len() + chunk.len() > MAX_FRAME {
            return self.overflow();
        }
        self.line.extend_from_slice(chunk);
    }

    fn finish_frames(&mut self, on_frame: &mut impl FnMut(&str, &str, Option<&str>)) {
        if self.overflowed {
            return;
        }
        self.at_start = false;
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            let line = line.strip_prefix(BOM).unwrap_or(&line);
            self.line_complete(line, on_frame);
        }
        self.dispatch(on_frame);
    }

    fn line_complete(&mut self, line: &[u8], on_frame: &mut impl FnMut(&str, &str, Option<&str>)) {
        if line.is_empty() {
            return self.dispatch(on_frame);
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match field {
            b"data" => {
                if self.data.len() + value.len() + 1 > MAX_FRAME {
                    return self.overflow();
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.has_data = true;
                push_utf8(&mut self.data, value);
            }
            b"event" => {
                self.event.clear();
                push_utf8(&mut self.event, value);
            }
            b"id" if !value.contains(&0) && value.len() <= MAX_ID => {
                self.last_id.clear();
                push_utf8(&mut self.last_id, value);
                self.frame_has_id = true;
            }
            // `retry` and unknown fields.
            _ => {}
        }
    }

    fn dispatch(&mut self, on_frame: &mut impl FnMut(&str, &str, Option<&str>)) {
        if self.has_data {
            on_frame(
                &self.event,
                &self.data,
                self.frame_has_id.then_some(self.last_id.as_str()),
            );
        }
        self.frame_has_id = false;
        // Cleared, not replaced: the buffers keep their capacity for the next frame.
        self.has_data = false;
        self.event.clear();
        self.data.clear();
    }
}

/// Appends `bytes` as text; invalid UTF-8 becomes U+FFFD (checked with the standard library's
/// fast validation first, since a stream is almost always valid).
fn push_utf8(buf: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => buf.push_str(text),
        Err(_) => buf.push_str(&String::from_utf8_lossy(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_or_a_frame_over_the_bound_stops_the_decoder() {
        // One endless line, fed in chunks: never buffered past the bound.
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        decoder.feed(b"data: ", &mut out);
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..(MAX_FRAME / chunk.len() + 2) {
            decoder.feed(&chunk, &mut out);
        }
        assert!(decoder.overflowed());
        assert!(decoder.line.capacity() <= MAX_FRAME);
        decoder.feed(b"\n\ndata: after\n\n", &mut out);
        decoder.finish(&mut out);
        assert!(out.is_empty(), "nothing after the overflow is decoded");
        // Many short data lines adding up to too much for one frame.
        let mut decoder = Decoder::new();
        let line = format!("data: {}\n", "y".repeat(64 * 1024));
        for _ in 0..(MAX_FRAME / line.len() + 2) {
            decoder.feed(line.as_bytes(), &mut out);
        }
        assert!(decoder.overflowed());
        assert!(out.is_empty());
        // Just under the bound is fine.
        let mut decoder = Decoder::new();
        let big = format!("data: {}\n\n", "z".repeat(MAX_FRAME - 16));
        decoder.feed(big.as_bytes(), &mut out);
        assert!(!decoder.overflowed());
        assert_eq!(out.len(), 1);
    }

    fn frames(input: &[u8]) -> Vec<Frame> {
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        decoder.feed(input, &mut out);
        decoder.finish(&mut out);
        out
    }

    fn frames_bytewise(input: &[u8]) -> Vec<Frame> {
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        for byte in input {
            decoder.feed(std::slice::from_ref(byte), &mut out);
        }
        decoder.finish(&mut out);
        out
    }

    fn frame(event: &str, data: &str) -> Frame {
        super::frame(event, data, None)
    }

    #[test]
    fn the_last_event_id_persists_across_frames() {
        let input = b"id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\nid: x\0y\ndata: d\n\n";
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        decoder.feed(input, &mut out);
        let ids: Vec<Option<&str>> = out.iter().map(|f| f.id.as_deref()).collect();
        // `id` with no value resets it; one holding NUL is ignored.
        assert_eq!(ids, [Some("7"), None, Some(""), None]);
        assert_eq!(decoder.last_event_id(), "");
        decoder.feed(b"id: 9\n\n", &mut out);
        assert_eq!(
            decoder.last_event_id(),
            "9",
            "an id without data still counts"
        );
    }

    #[test]
    fn multi_line_data_joins_with_newline() {
        let input = b"data: first\ndata: second\ndata:third\n\n";
        assert_eq!(frames(input), vec![frame("", "first\nsecond\nthird")]);
    }

    #[test]
    fn comments_and_unknown_fields_are_skipped() {
        let input = b": keep-alive\n\nretry: 100\nfoo: bar\ndata: x\n: inside\n\n";
        assert_eq!(frames(input), vec![frame("", "x")]);
    }

    #[test]
    fn event_name_applies_to_one_frame() {
        let input = b"event: ping\ndata: {}\n\ndata: next\n\n";
        assert_eq!(frames(input), vec![frame("ping", "{}"), frame("", "next")]);
    }

    #[test]
    fn all_line_endings_are_equivalent() {
        let lf = b"event: a\ndata: 1\n\ndata: 2\n\n".to_vec();
        let crlf = b"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n".to_vec();
        let cr = b"event: a\rdata: 1\r\rdata: 2\r\r".to_vec();
        let expected = vec![frame("a", "1"), frame("", "2")];
        for input in [lf, crlf, cr] {
            assert_eq!(frames(&input), expected);
            assert_eq!(frames_bytewise(&input), expected);
        }
    }

    #[test]
    fn crlf_split_between_chunks_is_one_line_ending() {
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        decoder.feed(b"data: a\r", &mut out);
        decoder.feed(b"\ndata: b\r", &mut out);
        decoder.feed(b"\n\r", &mut out);
        decoder.feed(b"\n", &mut out);
        assert_eq!(out, vec![frame("", "a\nb")]);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let out = frames(b"event: t\xffx\ndata: a\xff\xfeb\n\n");
        assert_eq!(out, vec![frame("t\u{fffd}x", "a\u{fffd}\u{fffd}b")]);
    }

    #[test]
    fn utf8_split_inside_a_character_is_reassembled() {
        let input = "data: Olá — 日本語 🎉\n\n".as_bytes();
        let expected = vec![frame("", "Olá — 日本語 🎉")];
        for cut in 0..input.len() {
            let mut decoder = Decoder::new();
            let mut out = Vec::new();
            decoder.feed(&input[..cut], &mut out);
            decoder.feed(&input[cut..], &mut out);
            decoder.finish(&mut out);
            assert_eq!(out, expected, "cut at {cut}");
        }
    }

    #[test]
    fn final_frame_without_blank_line_is_flushed() {
        assert_eq!(frames(b"data: {\"a\":1}"), vec![frame("", "{\"a\":1}")]);
        assert_eq!(frames(b"event: x\ndata: y\n"), vec![frame("x", "y")]);
    }

    #[test]
    fn field_without_colon_and_empty_data() {
        // `data` alone is a data line with an empty value; an empty data still dispatches.
        assert_eq!(frames(b"data\n\n"), vec![frame("", "")]);
        assert_eq!(frames(b"data:\ndata:\n\n"), vec![frame("", "\n")]);
        // Only one leading space is removed.
        assert_eq!(frames(b"data:  two\n\n"), vec![frame("", " two")]);
    }

    #[test]
    fn frames_without_data_are_not_dispatched() {
        assert_eq!(frames(b"event: lonely\n\n\n\n"), vec![]);
    }

    #[test]
    fn bom_is_skipped_even_when_split() {
        let input = "\u{feff}data: x\n\n".as_bytes();
        assert_eq!(frames(input), vec![frame("", "x")]);
        assert_eq!(frames_bytewise(input), vec![frame("", "x")]);
    }
}
