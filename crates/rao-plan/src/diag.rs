//! Errors a person can act on: file:line:column, the offending line, and what to do.

use std::fmt;

use crate::spec::Pos;

/// One problem found in a pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub pos: Pos,
    pub message: String,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn new(pos: Pos, message: impl Into<String>) -> Self {
        Diagnostic { pos, message: message.into(), help: None }
    }
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

/// All problems found in one file, with the text needed to show them.
#[derive(Debug, Clone)]
pub struct Diagnostics {
    pub file: String,
    pub source: String,
    pub items: Vec<Diagnostic>,
}

impl std::error::Error for Diagnostics {}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for (i, d) in self.items.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            render_one(f, &self.file, &self.source, d)?;
        }
        if self.items.len() > 1 {
            write!(f, "\n{} problems in {}; nothing was run.", self.items.len(), self.file)?;
        }
        Ok(())
    }
}

fn render_one(f: &mut fmt::Formatter, file: &str, source: &str, d: &Diagnostic) -> fmt::Result {
    writeln!(f, "error: {}", d.message)?;
    if d.pos.line == 0 {
        writeln!(f, "  --> {file}")?;
    } else {
        writeln!(f, "  --> {file}:{}:{}", d.pos.line, d.pos.column)?;
        if let Some(line) = source.lines().nth(d.pos.line as usize - 1) {
            let num = d.pos.line.to_string();
            let pad = " ".repeat(num.len());
            writeln!(f, "{pad} |")?;
            writeln!(f, "{num} | {line}")?;
            let caret_at = (d.pos.column.max(1) - 1) as usize;
            let width = token_width(line, caret_at);
            writeln!(f, "{pad} | {}{}", " ".repeat(caret_at), "^".repeat(width))?;
        }
    }
    if let Some(h) = &d.help {
        writeln!(f, "  = help: {h}")?;
    }
    Ok(())
}

/// Underline the word at `start` (at least one character).
fn token_width(line: &str, start: usize) -> usize {
    let rest: String = line.chars().skip(start).collect();
    let w = rest.chars().take_while(|c| !c.is_whitespace() && !matches!(c, ':' | ',' | ']' | '}')).count();
    w.max(1)
}

/// "did you mean `x`?" for a misspelt name, when one candidate is close enough.
pub fn did_you_mean<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut best: Option<(f64, &str)> = None;
    for c in candidates {
        let score = strsim::jaro_winkler(wrong, c);
        if score > 0.75 && best.is_none_or(|(b, _)| score > b) {
            best = Some((score, c));
        }
    }
    best.map(|(_, c)| format!("did you mean `{c}`?"))
}
