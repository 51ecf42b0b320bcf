//! The summary a compaction asks for, as pure functions: where the kept window starts, the
//! request text (older history serialized, tool output cut, fitted to a byte budget), the
//! template a reply must follow, and the quote that keeps the latest user request visible.
//! `compaction` carries them out; they are tested here without a store or a provider.

use agenthost_model::{Message, Part, ToolState};

/// The sections a summary has, in order.
pub const SECTIONS: [&str; 5] = [
    "Objective",
    "Important Details",
    "Work State",
    "Next Move",
    "Relevant Files",
];

/// The section the runtime appends (never the model) when the latest user request is no longer
/// in the kept window.
pub const LATEST_REQUEST: &str = "## Latest User Request";

/// How every summary request begins.
pub const SUMMARY_REQUEST: &str = "You are compacting the history of an agent session: the agent \
     will carry on from your summary alone, without the conversation below.";

/// Characters of one tool input or output kept in the summary request.
pub const TOOL_CHARS: usize = 2_000;

/// Bytes of the quoted latest request kept in a summary.
const QUOTE_BYTES: usize = 16 * 1024;

/// Where the kept window starts among `count` messages whose sizes `size(i)` gives: walking back
/// from the newest message while the kept part stays within `keep_tokens` (always keeping the
/// newest message), at any message boundary. Tool calls and their results live in one assistant
/// message, so no boundary separates them. `None` when nothing older would be left to summarize.
pub fn split(count: usize, keep_tokens: u64, size: impl Fn(usize) -> u64) -> Option<usize> {
    let mut kept = 0;
    let mut at = count;
    while at > 0 {
        let size = size(at - 1);
        if at < count && kept + size > keep_tokens {
            break;
        }
        kept += size;
        at -= 1;
    }
    (at > 0).then_some(at)
}

/// The text of the newest user message in `messages`.
pub fn latest_request(messages: &[Message]) -> Option<&str> {
    messages.iter().rev().find_map(|m| match m {
        Message::User { prompt, .. } => Some(prompt.text.as_str()),
        _ => None,
    })
}

/// The request quoted in a summary's latest-request section, unquoted, if it has one.
pub fn quoted_request(summary: &str) -> Option<String> {
    let at = summary.find(LATEST_REQUEST)?;
    let lines: Vec<&str> = summary[at + LATEST_REQUEST.len()..]
        .trim()
        .lines()
        .map(|l| l.strip_prefix("> ").or(l.strip_prefix('>')).unwrap_or(l))
        .collect();
    Some(lines.join("\n"))
}

/// A summary without the runtime's latest-request section (a model may copy it).
fn without_quote(summary: &str) -> &str {
    match summary.find(LATEST_REQUEST) {
        Some(at) => summary[..at].trim_end(),
        None => summary.trim_end(),
    }
}

/// The summary as stored: the model's reply, then the latest request quoted when the kept window
/// no longer shows it.
pub fn stored(reply: &str, quote: Option<&str>) -> String {
    let reply = without_quote(reply.trim());
    match quote {
        Some(quote) => {
            let quote = preview(quote.trim(), QUOTE_BYTES);
            let quoted: Vec<String> = quote.lines().map(|l| format!("> {l}")).collect();
            format!("{reply}\n\n{LATEST_REQUEST}\n{}", quoted.join("\n"))
        }
        None => reply.to_owned(),
    }
}

/// `text` cut to about `max` characters: head and tail, with a marker saying how much was cut.
pub fn cut_chars(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_owned();
    }
    let head = max * 3 / 4;
    let tail = max - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(total - tail).collect();
    format!(
        "{start}\n[… {} characters cut …]\n{end}",
        total - head - tail
    )
}

/// The head (three quarters) and tail of `text` that fit in `max` bytes together, on character
/// boundaries, with the bytes cut between them; `None` when `text` fits whole.
pub fn head_and_tail(text: &str, max: usize) -> Option<(&str, &str, usize)> {
    if text.len() <= max {
        return None;
    }
    let mut head = max * 3 / 4;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (max - head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    Some((&text[..head], &text[tail..], tail - head))
}

/// `text` cut to at most about `max` bytes on character boundaries: head and tail with a marker.
pub fn preview(text: &str, max: usize) -> String {
    match head_and_tail(text, max) {
        Some((head, tail, cut)) => format!("{head}\n[… {cut} bytes cut …]\n{tail}"),
        None => text.to_owned(),
    }
}

/// One message as summary-request text; `None` for what the model never saw (compactions).
pub fn entry(message: &Message) -> Option<String> {
    match message {
        Message::User { prompt, .. } => {
            let mut text = format!("### User\n{}", prompt.text);
            for file in &prompt.files {
                let name = file.filename.as_deref().unwrap_or("unnamed");
                text.push_str(&format!("\n[file {name} ({})]", file.mime));
            }
            Some(text)
        }
        Message::System { text, .. } => Some(format!("### Instructions update\n{text}")),
        Message::Assistant(a) => {
            let mut text = String::from("### Assistant");
            for part in &a.parts {
                match part {
                    Part::Text { text: t, .. } if !t.is_empty() => {
                        text.push('\n');
                        text.push_str(t);
                    }
                    Part::Text { .. } | Part::Reasoning { .. } | Part::Approval(_) => {}
                    Part::Tool(tool) => {
                        text.push_str(&format!(
                            "\n[tool call {} ({})] input: {}",
                            tool.name,
                            tool.call_id,
                            cut_chars(&tool.input, TOOL_CHARS)
                        ));
                        let result = match &tool.state {
                            ToolState::Completed { output, .. } => {
                                format!("output: {}", cut_chars(output, TOOL_CHARS))
                            }
                            ToolState::Error { error } => {
                                format!("error: {}", cut_chars(error, TOOL_CHARS))
                            }
                            ToolState::Running => "not finished".to_owned(),
                            ToolState::Held => "waiting for approval; not run".to_owned(),
                        };
                        text.push_str(&format!("\n[tool result {}] {result}", tool.call_id));
                    }
                }
            }
            Some(text)
        }
        Message::Compaction { .. } => None,
    }
}

/// The summary request: the instructions, the previous summary to update (if any) and as much
/// of `older` serialized as fits in `budget` bytes, newest kept, oldest dropped with a marker.
/// Only what is sent is serialized.
pub fn request(previous: Option<&str>, older: &[Message], budget: usize) -> String {
    fit(previous, older.len(), |i| entry(&older[i]), budget)
}

/// [`request`] over `count` entries that `entry(i)` serializes (`None`: not sent at all).
fn fit(
    previous: Option<&str>,
    count: usize,
    entry: impl Fn(usize) -> Option<String>,
    budget: usize,
) -> String {
    let mut text = format!(
        "{SUMMARY_REQUEST} Keep every fact it needs to continue the work: the user's goal and \
         constraints, decisions made, what the tools returned that matters, what is done and \
         what is not, exact names, numbers and paths.\n"
    );
    if let Some(previous) = previous {
        text.push_str(
            "\nThe summary of what came before is below. Update it with the newer conversation: \
             keep what still holds, drop what no longer matters.\n<previous-summary>\n",
        );
        text.push_str(&preview(previous, budget / 2));
        text.push_str("\n</previous-summary>\n");
    }
    let template = template();
    let room = budget.saturating_sub(text.len() + template.len() + 64);
    // Newest first until the room is spent.
    let mut sent: Vec<String> = Vec::new();
    let mut used = 0;
    let mut at = count;
    let mut first = None;
    while at > 0 {
        let Some(entry) = entry(at - 1) else {
            at -= 1;
            continue;
        };
        if used + entry.len() + 2 > room {
            first = Some(entry);
            break;
        }
        used += entry.len() + 2;
        sent.push(entry);
        at -= 1;
    }
    text.push_str("\n<conversation>\n");
    if let Some(first) = first {
        // `at` counts the first one that did not fit too.
        text.push_str(&format!(
            "[{at} earlier messages omitted: they did not fit this request]\n\n"
        ));
        if sent.is_empty() {
            // Not even the newest fits whole: its head and tail do.
            text.push_str(&preview(&first, room.saturating_sub(128)));
            text.push_str("\n\n");
        }
    }
    for entry in sent.iter().rev() {
        text.push_str(entry);
        text.push_str("\n\n");
    }
    text.push_str("</conversation>\n\n");
    text.push_str(&template);
    text
}

/// How the reply must look.
pub fn template() -> String {
    let mut text = String::from(
        "Reply with the summary only, in Markdown, with exactly these sections in this order:\n",
    );
    for section in SECTIONS {
        text.push_str(&format!("## {section}\n"));
    }
    text.push_str(
        "Objective: what the user wants. Important Details: facts, constraints and decisions. \
         Work State: what is done and what is in progress. Next Move: the very next thing to do. \
         Relevant Files: paths and resources in play (\"none\" if there are none).",
    );
    text
}

/// Whether `reply` follows the template: every section heading on a line of its own, in order,
/// each with some content.
pub fn check(reply: &str) -> Result<(), String> {
    let headings: Vec<(usize, &str)> = reply
        .lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let line = line.trim();
            let name = line.strip_prefix("## ")?.trim().trim_end_matches(':');
            Some((i, name))
        })
        .collect();
    let mut at = 0;
    let mut missing = Vec::new();
    for section in SECTIONS {
        match headings[at..]
            .iter()
            .position(|(_, name)| name.eq_ignore_ascii_case(section))
        {
            Some(found) => at += found + 1,
            None => missing.push(section),
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "the summary lacks the section(s) {} (or has them out of order)",
            missing.join(", ")
        ));
    }
    let lines: Vec<&str> = reply.lines().collect();
    for (n, (line, name)) in headings.iter().enumerate() {
        let end = headings.get(n + 1).map_or(lines.len(), |(l, _)| *l);
        if lines[line + 1..end].iter().all(|l| l.trim().is_empty()) {
            return Err(format!("the summary's section {name} is empty"));
        }
    }
    Ok(())
}

/// Opens a summary kept although it does not follow the template, so that whoever reads it (the
/// model, an operator) knows which sections it may lack.
pub const OFF_TEMPLATE: &str = "[This summary does not follow the requested template";

/// A summary reply kept although it misses the template (`problem` says how), marked as such.
pub fn off_template(reply: &str, problem: &str) -> String {
    format!("{OFF_TEMPLATE}: {problem}.]\n\n{}", reply.trim())
}

/// What the model is told when its reply did not follow the template.
pub fn reminder(problem: &str) -> String {
    format!(
        "Your reply did not follow the required format: {problem}. Reply again with the summary \
         only, with exactly the sections {}, each as a `## ` heading with content.",
        SECTIONS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> String {
        SECTIONS
            .iter()
            .map(|s| format!("## {s}\n- something about {s}\n"))
            .collect()
    }

    #[test]
    fn the_kept_window_starts_at_any_boundary_and_keeps_the_newest_message() {
        let split = |sizes: &[u64], keep| split(sizes.len(), keep, |i| sizes[i]);
        // Newest first: 3 + 3 fit in 6, the next does not.
        assert_eq!(split(&[5, 5, 3, 3], 6), Some(2));
        // The newest alone exceeds the budget: it is kept anyway.
        assert_eq!(split(&[5, 50], 6), Some(1));
        // Everything fits: nothing older to summarize.
        assert_eq!(split(&[1, 1], 6), None);
        assert_eq!(split(&[50], 6), None);
        assert_eq!(split(&[], 6), None);
    }

    #[test]
    fn the_template_is_checked_section_by_section() {
        assert_eq!(check(&good()), Ok(()));
        // Case and a trailing colon do not matter.
        assert_eq!(
            check(&good().to_lowercase().replace("\n- ", ":\n- ")),
            Ok(())
        );
        let missing = good().replace("## Next Move", "Next Move");
        assert!(check(&missing).unwrap_err().contains("Next Move"));
        let empty = good().replace("- something about Work State\n", "\n");
        assert!(check(&empty).unwrap_err().contains("Work State"));
        assert!(check("Here is a summary: it went fine.").is_err());
        let swapped = good()
            .replace("## Objective", "## TMP")
            .replace("## Relevant Files", "## Objective")
            .replace("## TMP", "## Relevant Files");
        assert!(check(&swapped).is_err());
    }

    #[test]
    fn tool_output_is_cut_to_head_and_tail() {
        let long = format!("{}{}", "a".repeat(5_000), "z".repeat(5_000));
        let cut = cut_chars(&long, TOOL_CHARS);
        assert!(cut.starts_with(&"a".repeat(1_500)));
        assert!(cut.ends_with(&"z".repeat(500)));
        assert!(cut.contains("8000 characters cut"));
        assert!(cut.chars().count() < TOOL_CHARS + 64);
        assert_eq!(cut_chars("short", TOOL_CHARS), "short");
        // Multi-byte characters are never split.
        let wide = "é".repeat(3_000);
        assert!(cut_chars(&wide, 100).contains("2900 characters cut"));
        assert!(preview(&wide, 101).contains("bytes cut"));
    }

    #[test]
    fn the_request_fits_its_budget_dropping_the_oldest() {
        let request = |previous: Option<&str>, entries: &[String], budget| {
            fit(
                previous,
                entries.len(),
                |i| Some(entries[i].clone()),
                budget,
            )
        };
        let entries: Vec<String> = (0..100)
            .map(|i| format!("{i:03}{}", "x".repeat(997)))
            .collect();
        let text = request(Some("## Objective\nold"), &entries, 20_000);
        assert!(text.len() <= 20_000, "{}", text.len());
        assert!(text.contains("099xxx"), "the newest is kept");
        assert!(!text.contains("000xxx"), "the oldest is dropped");
        assert!(text.contains("earlier messages omitted"));
        assert!(text.contains("<previous-summary>\n## Objective\nold"));
        assert!(text.ends_with(&template()));
        // Everything fits: nothing is omitted.
        let text = request(None, &entries[..3], 20_000);
        assert!(!text.contains("omitted") && text.contains("000xxx"));
        // Not even the newest fits whole: its head and tail do.
        let huge = vec!["h".repeat(100_000)];
        let text = request(None, &huge, 20_000);
        assert!(text.len() <= 20_000 && text.contains("bytes cut"));
    }

    #[test]
    fn the_latest_request_is_quoted_once_by_the_runtime() {
        let reply = good();
        let summary = stored(&reply, Some("fix the build\nthen ship"));
        assert!(summary.starts_with(reply.trim()));
        assert_eq!(
            quoted_request(&summary).as_deref(),
            Some("fix the build\nthen ship")
        );
        // A model that copied the section does not make it appear twice.
        let copied = format!("{summary}\n");
        let again = stored(&copied, Some("fix the build"));
        assert_eq!(again.matches(LATEST_REQUEST).count(), 1);
        assert_eq!(stored(&reply, None), reply.trim());
    }
}
