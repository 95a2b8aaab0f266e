//! serde's type errors (`invalid type: string "40", expected usize`) in the words of the person
//! who wrote the file: what the value should be, what it is, and how to write it.

/// `message` rewritten when it is one of serde's type or value errors; otherwise as it is.
pub fn in_users_words(message: &str) -> String {
    let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|rest| rest.rsplit_once(", expected "))
    else {
        return message.to_string();
    };
    let want = expected_words(expected);
    let (got, literal) = found_words(found);
    let mut out = format!("expected {want}, found {got}");
    // A number written in quotes reads as text in YAML.
    if let Some(text) = literal
        && !want.starts_with("text")
        && (text.parse::<f64>().is_ok() || text == "true" || text == "false")
    {
        out.push_str(&format!(" (write {text} without quotes)"));
    }
    out
}

fn expected_words(expected: &str) -> String {
    match expected {
        "usize" | "u8" | "u16" | "u32" | "u64" => "a whole number, 0 or more".into(),
        "isize" | "i8" | "i16" | "i32" | "i64" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a string" => "text".into(),
        "a sequence" => "a list, e.g. `[1, 2]`".into(),
        "a map" => "a mapping of keys to values, e.g. `{key: value}`".into(),
        e if e.starts_with("struct ") => "a mapping of keys to values, e.g. `{key: value}`".into(),
        e if e.starts_with("a nonzero") => "a whole number above 0".into(),
        e => e.to_string(),
    }
}

/// serde's "unexpected" in words, and the text of a string value (to suggest dropping quotes).
fn found_words(found: &str) -> (String, Option<String>) {
    let quoted = |prefix: &str, quote: char| {
        found.strip_prefix(prefix).and_then(|r| r.strip_prefix(quote)).and_then(|r| r.strip_suffix(quote)).map(str::to_string)
    };
    if let Some(text) = quoted("string ", '"') {
        return (format!("the text \"{text}\""), Some(text));
    }
    if let Some(n) = quoted("integer ", '`') {
        return (n, None);
    }
    if let Some(n) = quoted("floating point ", '`') {
        return (n, None);
    }
    if let Some(b) = quoted("boolean ", '`') {
        return (b, None);
    }
    let words = match found {
        "sequence" => "a list",
        "map" => "a mapping",
        "unit value" | "unit" => "nothing (null)",
        other => other,
    };
    (words.to_string(), None)
}

#[cfg(test)]
mod tests {
    use super::in_users_words;

    #[test]
    fn serde_type_errors_read_as_the_user_wrote_them() {
        let cases = [
            (
                "invalid type: string \"40\", expected usize",
                "expected a whole number, 0 or more, found the text \"40\" (write 40 without quotes)",
            ),
            ("invalid type: string \"lots\", expected usize", "expected a whole number, 0 or more, found the text \"lots\""),
            ("invalid value: integer `-4`, expected usize", "expected a whole number, 0 or more, found -4"),
            ("invalid type: floating point `0.5`, expected u32", "expected a whole number, 0 or more, found 0.5"),
            (
                "invalid type: string \"true\", expected a boolean",
                "expected true or false, found the text \"true\" (write true without quotes)",
            ),
            ("invalid type: integer `3`, expected a sequence", "expected a list, e.g. `[1, 2]`, found 3"),
            ("invalid type: sequence, expected f64", "expected a number, found a list"),
            ("invalid type: map, expected a string", "expected text, found a mapping"),
            ("missing field `url`", "missing field `url`"),
        ];
        for (serde, ours) in cases {
            assert_eq!(in_users_words(serde), ours, "{serde}");
        }
    }
}
