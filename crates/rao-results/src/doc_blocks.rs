//! Generated tables inside a Markdown document: each sits between an opening comment that holds
//! the `rao compare` arguments that make it and a closing one, so `rao results` can rewrite the
//! table from the store and check that nothing in it was typed by hand.
//!
//! ```markdown
//! <!-- rao compare pipelines/a.yaml pipelines/b.yaml --seeds 1,2,3 --metric success -->
//! (the table, written by `rao results`)
//! <!-- end rao compare -->
//! ```

use std::ops::Range;

pub const OPEN: &str = "<!-- rao compare ";
pub const CLOSE: &str = "<!-- end rao compare -->";

/// One generated block of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The opening comment's line, from 1.
    pub line: usize,
    /// `rao compare`'s arguments, as written (split at whitespace outside `'…'`).
    pub args: Vec<String>,
    /// The bytes between the opening comment's line and the closing one.
    pub body: Range<usize>,
}

impl Block {
    /// The command as a reader would type it (and a POSIX shell reads back into `args`).
    pub fn command(&self) -> String {
        let quoted: Vec<String> = self.args.iter().map(|a| rao_pipeline::ray::shell_quote(a)).collect();
        format!("rao compare {}", quoted.join(" "))
    }
}

/// Characters that a shell would interpret outside quotes: the arguments are not run by one, so
/// a reader who pasted the command would get something else than `rao results` does.
const SHELL_CHARACTERS: &[char] = &['"', '\\', '$', '`', '*', '?', '[', '{', '~', ';', '|', '&', '<', '>'];

/// `inner` split as a POSIX shell splits words when the only quoting is `'…'` (everything inside
/// is literal, e.g. `'B:params.limits={window: 256}'`); a character a shell would interpret
/// outside quotes is refused, naming it.
fn words(inner: &str) -> Result<Vec<String>, String> {
    let (mut words, mut word, mut quoted) = (Vec::new(), None::<String>, false);
    for c in inner.chars() {
        match (quoted, c) {
            (true, '\'') => quoted = false,
            (true, c) => word.get_or_insert_default().push(c),
            (false, '\'') => {
                quoted = true;
                word.get_or_insert_default();
            }
            (false, c) if c.is_whitespace() => words.extend(word.take()),
            (false, c) if SHELL_CHARACTERS.contains(&c) => {
                return Err(format!(
                    "`{c}` in the arguments: write each one plainly or inside '…' (no double quotes, globs, variables or \
                     `~` outside them), since they are split at spaces and not run by a shell"
                ));
            }
            (false, c) => word.get_or_insert_default().push(c),
        }
    }
    if quoted {
        return Err("a `'` is never closed: end the quoted argument with another `'`".into());
    }
    words.extend(word);
    Ok(words)
}

/// A block that cannot be read: its line (from 1) and what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for BlockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for BlockError {}

fn error(line: usize, message: String) -> BlockError {
    BlockError { line, message }
}

/// Every block of `text`, in order.
pub fn blocks(text: &str) -> Result<Vec<Block>, BlockError> {
    let mut found = Vec::new();
    let mut open: Option<(usize, Vec<String>, usize)> = None;
    let mut offset = 0;
    // Inside a fenced code block a comment is an example, not a block (documents show the syntax).
    let mut fence: Option<&str> = None;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let number = i + 1;
        let start = offset;
        offset += line.len();
        let trimmed = line.trim();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) if open.is_none() => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            _ => {}
        }
        if fence.is_some() || marker.is_some() {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix(OPEN) {
            if let Some((at, _, _)) = &open {
                return Err(error(
                    number,
                    format!("a block opens inside the one opened at line {at}: close that one first with `{CLOSE}`"),
                ));
            }
            let Some(inner) = rest.strip_suffix("-->") else {
                return Err(error(number, "the opening comment must end on its line with `-->`".into()));
            };
            let args = words(inner).map_err(|m| error(number, m))?;
            if args.is_empty() {
                return Err(error(number, format!("no pipelines to compare: `{OPEN}A.yaml B.yaml --seeds 1,2,3 -->`")));
            }
            open = Some((number, args, offset));
        } else if trimmed == CLOSE {
            match open.take() {
                Some((line, args, body_start)) => found.push(Block { line, args, body: body_start..start }),
                None => return Err(error(number, format!("`{CLOSE}` closes no block (its `{OPEN}… -->` is missing)"))),
            }
        } else if trimmed.starts_with("<!-- rao ") && trimmed.contains("compare") {
            return Err(error(number, format!("not a block's comment: open with `{OPEN}ARGS -->` and close with `{CLOSE}`")));
        }
    }
    match open {
        Some((line, _, _)) => Err(error(line, format!("this block is never closed: add `{CLOSE}` on a line after its table"))),
        None => Ok(found),
    }
}

/// `text` with each block's body replaced by the matching entry of `bodies` (`None`: kept).
pub fn splice(text: &str, blocks: &[Block], bodies: &[Option<String>]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (b, body) in blocks.iter().zip(bodies) {
        if let Some(body) = body {
            out.push_str(&text[at..b.body.start]);
            out.push_str(body);
            at = b.body.end;
        }
    }
    out.push_str(&text[at..]);
    out
}

/// A table as it sits in a block: a blank line on each side, so Markdown reads it as a table
/// whatever surrounds the comments.
pub fn body(table: &str) -> String {
    format!("\n{}\n\n", table.trim_end_matches('\n'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Results\n\nText.\n\n<!-- rao compare a.yaml b.yaml --seeds 1,2 -->\nold table\n<!-- end rao compare -->\n\nMore.\n  <!-- rao compare c.yaml -->\n<!-- end rao compare -->\n";

    #[test]
    fn finds_each_block_with_its_line_arguments_and_body() {
        let b = blocks(DOC).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].line, b[0].args.clone()), (5, vec!["a.yaml".into(), "b.yaml".into(), "--seeds".into(), "1,2".into()]));
        assert_eq!(&DOC[b[0].body.clone()], "old table\n");
        assert_eq!((b[1].line, &DOC[b[1].body.clone()]), (10, ""));
        assert_eq!(b[1].command(), "rao compare c.yaml");
    }

    #[test]
    fn single_quotes_hold_an_argument_with_spaces_and_the_command_quotes_it_again() {
        let doc =
            "<!-- rao compare a.yaml a.yaml --set 'B:params.limits={window: 256, max_nodes: 64}' --seeds 1 -->\n<!-- end rao compare -->\n";
        let b = blocks(doc).unwrap();
        assert_eq!(b[0].args, ["a.yaml", "a.yaml", "--set", "B:params.limits={window: 256, max_nodes: 64}", "--seeds", "1"]);
        assert_eq!(b[0].command(), "rao compare a.yaml a.yaml --set 'B:params.limits={window: 256, max_nodes: 64}' --seeds 1");
        // Quotes join what they touch, as in a shell; inside them nothing is interpreted.
        let joined = "<!-- rao compare x'y z'w '$HOME*' -->\n<!-- end rao compare -->\n";
        assert_eq!(blocks(joined).unwrap()[0].args, ["xy zw", "$HOME*"]);
    }

    #[test]
    fn splicing_replaces_only_the_bodies_asked() {
        let b = blocks(DOC).unwrap();
        assert_eq!(splice(DOC, &b, &[None, None]), DOC);
        let same: Vec<Option<String>> = b.iter().map(|b| Some(DOC[b.body.clone()].to_string())).collect();
        assert_eq!(splice(DOC, &b, &same), DOC);
        let new = splice(DOC, &b, &[Some(body("| new |\n")), None]);
        assert_eq!(new, DOC.replace("old table\n", "\n| new |\n\n"));
        // What was written is found again, in the same place.
        let again = blocks(&new).unwrap();
        assert_eq!(&new[again[0].body.clone()], "\n| new |\n\n");
        assert_eq!(again[1].line, b[1].line + 2);
    }

    #[test]
    fn a_broken_block_is_an_error_at_its_line() {
        let unclosed = "a\n<!-- rao compare x.yaml -->\n| t |\n";
        assert!(blocks(unclosed).unwrap_err().to_string().starts_with("line 2: this block is never closed"), "{:?}", blocks(unclosed));
        let stray = "a\n\n<!-- end rao compare -->\n";
        assert!(blocks(stray).unwrap_err().to_string().starts_with("line 3: `<!-- end rao compare -->` closes no block"));
        let nested = "<!-- rao compare x.yaml -->\n<!-- rao compare y.yaml -->\n<!-- end rao compare -->\n";
        assert!(blocks(nested).unwrap_err().to_string().starts_with("line 2: a block opens inside the one opened at line 1"));
        let quoted = "<!-- rao compare \"my file.yaml\" -->\n<!-- end rao compare -->\n";
        assert!(blocks(quoted).unwrap_err().to_string().starts_with("line 1: `\"` in the arguments"));
        let glob = "x\n<!-- rao compare pipelines/ablation-*.yaml -->\n<!-- end rao compare -->\n";
        assert!(blocks(glob).unwrap_err().to_string().starts_with("line 2: `*` in the arguments"));
        let unclosed_quote = "<!-- rao compare a.yaml 'B:x=1 -->\n<!-- end rao compare -->\n";
        assert!(blocks(unclosed_quote).unwrap_err().to_string().starts_with("line 1: a `'` is never closed"));
        let empty = "<!-- rao compare  -->\n<!-- end rao compare -->\n";
        assert!(blocks(empty).unwrap_err().to_string().starts_with("line 1: no pipelines to compare"));
        let misspelt = "<!-- rao compare: a.yaml -->\n";
        assert!(blocks(misspelt).unwrap_err().to_string().starts_with("line 1: not a block's comment"));
        let open_line = "<!-- rao compare a.yaml\n-->\n";
        assert!(blocks(open_line).unwrap_err().to_string().starts_with("line 1: the opening comment must end on its line"));
    }

    #[test]
    fn a_document_without_blocks_has_none() {
        assert_eq!(blocks("# Title\n\n<!-- a comment -->\n| a | b |\n").unwrap(), vec![]);
        let example =
            "Write:\n\n```markdown\n<!-- rao compare a.yaml -->\n<!-- end rao compare -->\n```\n~~~\n<!-- end rao compare -->\n~~~\n";
        assert_eq!(blocks(example).unwrap(), vec![]);
        assert_eq!(blocks("").unwrap(), vec![]);
    }
}
