//! Paths pasted into a shell stage's command (`${inputs.X}`, `${outputs.X}`), quoted for where
//! they land, so a store under `/data/my runs/` or a folder named `it's` reaches the command as
//! the path it is. A plain path (letters, digits, `/._-+,:=@%`) is pasted as it is: commands that
//! worked before read exactly the same text.
//!
//! Where a placeholder lands is read with the POSIX quoting rules: outside quotes each path
//! becomes one word (`'…'` when it needs quotes); inside `'…'` or `"…"` the path is escaped for
//! that kind of quote, so a user's own quotes keep working. Not followed: here-documents and
//! `$'…'` (a path needing quotes there is pasted as outside quotes).

use std::collections::BTreeMap;

#[derive(Clone, Copy, PartialEq)]
enum Quote {
    None,
    Single,
    Double,
}

/// `command` with each `${NAME}` whose `NAME` is a key of `values` replaced by its paths, quoted
/// for the place it stands in (several paths, e.g. a fan-in: separated by spaces). Other `${…}`
/// (the shell's own variables) are left alone.
pub fn fill(command: &str, values: &BTreeMap<String, Vec<String>>) -> String {
    let mut out = String::with_capacity(command.len());
    let mut quote = Quote::None;
    // The previous character was a backslash that escapes this one (outside single quotes).
    let mut escaped = false;
    let mut rest = command;
    while let Some(c) = rest.chars().next() {
        // Placeholders are filled wherever they stand, as they always were (even after `\`).
        if let Some(after) = rest.strip_prefix("${")
            && let Some(end) = after.find('}')
            && let Some(paths) = values.get(&after[..end])
        {
            let quoted: Vec<String> = paths.iter().map(|p| quote_for(p, quote)).collect();
            out.push_str(&quoted.join(" "));
            rest = &after[end + 1..];
            escaped = false;
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
        if std::mem::take(&mut escaped) {
            continue;
        }
        match (quote, c) {
            (Quote::None, '\'') => quote = Quote::Single,
            (Quote::None, '"') => quote = Quote::Double,
            (Quote::Single, '\'') | (Quote::Double, '"') => quote = Quote::None,
            (Quote::None | Quote::Double, '\\') => escaped = true,
            _ => {}
        }
    }
    out
}

fn quote_for(path: &str, quote: Quote) -> String {
    match quote {
        Quote::None if is_plain(path) => path.to_string(),
        Quote::None => format!("'{}'", path.replace('\'', r"'\''")),
        Quote::Single => path.replace('\'', r"'\''"),
        Quote::Double => path.chars().fold(String::new(), |mut s, c| {
            if matches!(c, '\\' | '"' | '$' | '`') {
                s.push('\\');
            }
            s.push(c);
            s
        }),
    }
}

fn is_plain(path: &str) -> bool {
    !path.is_empty() && path.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:=@%".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(command: &str) -> String {
        let o = std::process::Command::new("sh").args(["-c", command]).output().unwrap();
        assert!(o.status.success(), "{command}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }

    fn values(paths: &[&str]) -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([("inputs.i".to_string(), paths.iter().map(|p| p.to_string()).collect())])
    }

    #[test]
    fn plain_paths_are_pasted_as_they_are() {
        let v = values(&["/store/ab/cd/out", "/store/ef/out"]);
        assert_eq!(
            fill("cat ${inputs.i}/f '${inputs.i}' \"${inputs.i}\" ${HOME}", &v),
            "cat /store/ab/cd/out /store/ef/out/f '/store/ab/cd/out /store/ef/out' \"/store/ab/cd/out /store/ef/out\" ${HOME}"
        );
    }

    #[test]
    fn paths_that_need_quotes_reach_the_command_whole_in_every_quoting() {
        // What `sh` makes of the command is the test: each printed line must be one path.
        for path in ["/tmp/my store/out", "/tmp/it's/out", "/tmp/a\"b/$HOME/`x`\\y", "/tmp/tab\there"] {
            let v = values(&[path]);
            for command in [r#"printf '%s\n' ${inputs.i}"#, r#"printf '%s\n' "${inputs.i}""#, r#"printf '%s\n' '${inputs.i}'"#] {
                assert_eq!(sh(&fill(command, &v)), format!("{path}\n"), "{command} with {path:?}");
            }
        }
        // A fan-in outside quotes: one word per path.
        let v = values(&["/tmp/a b", "/tmp/c"]);
        assert_eq!(sh(&fill(r#"printf '%s\n' ${inputs.i}"#, &v)), "/tmp/a b\n/tmp/c\n");
        // An escaped quote does not open a quoted part.
        let v = values(&["/tmp/x y"]);
        assert_eq!(sh(&fill(r#"printf '%s\n' \'${inputs.i}"#, &v)), "'/tmp/x y\n");
    }
}
