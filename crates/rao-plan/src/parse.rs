//! YAML text → the spec's serde types, with errors that say what to fix in the user's terms
//! (not the parser library's), bounded in size and nesting.

use serde::de::DeserializeOwned;

use crate::diag::{Diagnostic, did_you_mean};
use crate::spec::Pos;

/// Largest pipeline file rao reads (a 55,000-stage file is about 4 MB).
pub const MAX_FILE_BYTES: usize = 32 << 20;

fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = 4_000_000;
    budget.max_events = 16_000_000;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Parse `text` as `T`.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, Diagnostic> {
    if text.len() > MAX_FILE_BYTES {
        return Err(Diagnostic::new(Pos::NONE, format!("the file is {} bytes; pipeline files are at most {MAX_FILE_BYTES}", text.len())));
    }
    serde_saphyr::from_str_with_options(text, options()).map_err(|e| diagnose(&e, text))
}

/// Most structural problems reported for one file.
const MAX_REPORTED: usize = 20;

/// Parse `text` as `T`, reporting every structural problem (misspelt keys, wrong types, YAML
/// syntax) rather than only the first, which is where the parser stops: each problem found
/// inside a stage entry (a key under some `stages:`) is recorded, that entry is replaced by an
/// empty one of the same name — lines are kept, so later positions stay put — and the text is
/// parsed again. A problem outside every stage entry ends the search.
pub fn parse_all<T: DeserializeOwned>(text: &str) -> Result<T, Vec<Diagnostic>> {
    let first = match parse::<T>(text) {
        Ok(v) => return Ok(v),
        Err(d) => d,
    };
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let entries = stage_entries(&lines);
    let mut found = vec![first];
    while found.len() < MAX_REPORTED {
        let line = found[found.len() - 1].pos.line as usize;
        let Some(&(start, end)) = entries.iter().filter(|(s, e)| (*s..=*e).contains(&line)).min_by_key(|(s, e)| e - s) else {
            break;
        };
        if !empty_entry(&mut lines, start, end) {
            break;
        }
        match parse::<T>(&lines.join("\n")) {
            // Only a problem further down is news (one at or above came from the replacement).
            Err(d) if d.pos.line as usize > line => found.push(d),
            _ => break,
        }
    }
    Err(found)
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_content(line: &str) -> bool {
    let t = line.trim_start();
    !t.is_empty() && !t.starts_with('#')
}

/// Line ranges (1-based, inclusive) of the entries of every block-style `stages:` mapping, nested
/// ones (loop bodies) included.
fn stage_entries(lines: &[String]) -> Vec<(usize, usize)> {
    let mut entries = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let head = line.trim_start();
        if !(head == "stages:" || head.starts_with("stages: #") || head.starts_with("stages:\t#")) {
            continue;
        }
        let outer = indent(line);
        let body: Vec<usize> = (i + 1..lines.len()).filter(|&k| is_content(&lines[k])).take_while(|&k| indent(&lines[k]) > outer).collect();
        let Some(&first) = body.first() else { continue };
        let inner = indent(&lines[first]);
        let starts: Vec<usize> =
            body.iter().copied().filter(|&k| indent(&lines[k]) == inner && !lines[k].trim_start().starts_with('-')).collect();
        for (n, &s) in starts.iter().enumerate() {
            // An entry runs to the line before the next entry, or to the end of the block.
            let end = match starts.get(n + 1) {
                Some(&next) => next - 1,
                None => *body.last().unwrap_or(&s),
            };
            entries.push((s + 1, end + 1));
        }
    }
    entries
}

/// Replace the entry on lines `start..=end` (1-based) by `NAME: {}` and blank lines.
fn empty_entry(lines: &mut [String], start: usize, end: usize) -> bool {
    let line = &lines[start - 1];
    let pad = indent(line);
    let Some(colon) =
        line.char_indices().skip(pad).find(|&(i, c)| c == ':' && line[i + 1..].chars().next().is_none_or(|n| n == ' ')).map(|(i, _)| i)
    else {
        return false;
    };
    let replacement = format!("{}: {{}}", &line[..colon]);
    lines[start - 1] = replacement;
    for l in &mut lines[start..end] {
        l.clear();
    }
    true
}

/// Turn a YAML/serde error into a diagnostic with a suggestion where one helps.
fn diagnose(e: &serde_saphyr::Error, text: &str) -> Diagnostic {
    let mut pos = e.location().map(|l| Pos { line: l.line(), column: l.column() }).unwrap_or(Pos::NONE);
    let full = e.without_snippet().to_string();
    // The message without serde-saphyr's own location suffix (we print positions ourselves).
    let msg = full.lines().next().unwrap_or(&full).to_string();
    let msg = match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    let (msg, help) = reword(&msg);
    if msg.starts_with("unclosed quote")
        && let Some(p) = unclosed_quote(text, pos)
    {
        pos = p;
    }
    let mut d = Diagnostic::new(pos, msg.clone());
    if let Some(h) = help {
        d = d.help(h);
    }
    d
}

/// The parser's words → what to fix.
fn reword(msg: &str) -> (String, Option<String>) {
    if let Some(rest) = msg.split("unknown field `").nth(1) {
        let wrong = rest.split('`').next().unwrap_or("");
        let expected: Vec<&str> = rest
            .split_once("expected")
            .map(|(_, e)| {
                e.trim_start_matches(" one of")
                    .trim_start_matches(" a field")
                    .split(',')
                    .map(|x| x.trim().trim_matches('`'))
                    .filter(|x| !x.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let hint = did_you_mean(wrong, expected.iter().copied()).unwrap_or_else(|| format!("allowed keys here: {}", expected.join(", ")));
        return (msg.to_string(), Some(hint));
    }
    if let Some(key) = msg.strip_prefix("duplicate mapping key: ") {
        let key = key.split(',').next().unwrap_or(key).trim();
        return (format!("duplicate key `{key}`"), Some("each key may appear once in a mapping; remove or rename one".into()));
    }
    if msg.starts_with("multiple YAML documents") {
        return (
            "the file holds more than one YAML document".into(),
            Some("a pipeline file is one document: remove the `---` line and what follows, or split it into files".into()),
        );
    }
    if msg.contains("budget") {
        return (
            "the file is too large or too deeply nested to read".into(),
            Some("pipeline files are limited to 4,000,000 YAML nodes and 64 levels of nesting; split it or use `matrix`/`loop`".into()),
        );
    }
    if msg.contains("missing field") {
        return (msg.to_string(), Some("add the missing key".into()));
    }
    if msg.starts_with("unexpected end of input") {
        return ("the file ends before the pipeline is complete".into(), Some("a pipeline needs at least `name:` and `stages:`".into()));
    }
    if msg.contains("duration") {
        return (msg.to_string(), Some("write seconds (`30`) or a number with ms, s, m or h (`10m`), at most a year".into()));
    }
    if msg.starts_with("non-finite float") {
        return ("a number that is not finite (`.nan`, `.inf`)".into(), Some("write a finite number".into()));
    }
    if msg == "expected mapping start" {
        return ("expected a mapping here".into(), Some("write `key: value` pairs, e.g. `{kind: noop}` or indented lines".into()));
    }
    if msg == "expected sequence start" {
        return ("expected a list here".into(), Some("write `[a, b]` or one `- item` per line".into()));
    }
    if msg.starts_with("expected string") {
        return ("expected text here".into(), Some("write a single value, e.g. `name: my-pipeline`".into()));
    }
    if msg.contains("untagged enum InputRef") {
        return ("expected `STAGE.OUTPUT` or a list of them".into(), Some("e.g. `tasks: synthesize.tasks`".into()));
    }
    for (ty, range) in [
        ("u32", "an integer from 0 to 4294967295"),
        ("u64", "an integer from 0 to 18446744073709551615"),
        ("i64", "an integer"),
        ("f64", "a number"),
        ("bool", "true or false"),
    ] {
        if msg == format!("invalid {ty}") || msg.starts_with(&format!("invalid {ty}:")) || msg.starts_with(&format!("invalid {ty} ")) {
            return (format!("expected {range}"), Some(format!("write {range} here")));
        }
    }
    if msg.contains("invalid type") || msg.starts_with("invalid ") {
        return (msg.to_string(), Some("change the value to the expected type".into()));
    }
    (msg.to_string(), Some("fix the YAML here (quotes, brackets, indentation)".into()))
}

/// Where an unclosed quote opened: the last line at or before `at` whose quotes do not pair up.
fn unclosed_quote(text: &str, at: Pos) -> Option<Pos> {
    let lines: Vec<&str> = text.lines().collect();
    let last = (at.line as usize).clamp(1, lines.len().max(1));
    for line_no in (1..=last).rev() {
        let line = lines.get(line_no - 1)?;
        let mut open: Option<(char, usize)> = None;
        for (col, c) in line.chars().enumerate() {
            match (open, c) {
                (None, '#') => break,
                (None, '"' | '\'') => open = Some((c, col)),
                (Some((q, _)), c) if c == q => open = None,
                _ => {}
            }
        }
        if let Some((_, col)) = open {
            return Some(Pos { line: line_no as u64, column: col as u64 + 1 });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_entries_cover_block_and_nested_stages() {
        let text = "name: x\nstages:\n  a: {kind: noop}\n  l:\n    loop: {max_iterations: 2}\n    stages:\n      b:\n        kind: noop\n\n      c: {kind: noop}\n  d:\n    kind: noop\n";
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        assert_eq!(stage_entries(&lines), vec![(3, 3), (4, 10), (11, 12), (7, 9), (10, 10)]);
    }

    #[test]
    fn an_unclosed_quote_is_found_where_it_opens() {
        let text = "name: x\nstages:\n  a: {kind: noop, params: {value: \"abc}\n  b: {kind: noop}\n  c: {kind: noop}\n";
        assert_eq!(unclosed_quote(text, Pos { line: 5, column: 3 }), Some(Pos { line: 3, column: 35 }));
    }
}
