//! Parsing a file's text, with errors that name the line and the key path.

use std::ops::Range;
use std::path::Path;

use toml::de::{DeTable, DeValue};

use super::*;

/// Parses a configuration's text; `path` is only used in messages.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let invalid =
        |span: Option<Range<usize>>, key: Option<String>, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: span.map(|span| line_of(text, span.start)),
            key,
            message,
        };
    // First the syntax, keeping every key's and value's position, so that a schema error
    // below can be given its key path.
    let tree = DeTable::parse(text).map_err(|error| {
        let message = match error.message() {
            "duplicate key" => match error.span() {
                Some(span) => format!("duplicate key {}", text[span].trim()),
                None => "duplicate key".to_string(),
            },
            message => message.to_string(),
        };
        invalid(error.span(), None, message)
    })?;
    toml::from_str::<Config>(text)
        .map_err(|error| {
            let span = error.span();
            let key = span
                .clone()
                .and_then(|span| find_path(tree.get_ref(), &span))
                .map(|path| render_path(&path));
            let message = explain(error.message(), key.as_deref());
            invalid(span, key, message)
        })
        .and_then(|config| {
            // Keys that go together: the line of the `[idle]` table.
            match config.idle.check() {
                Ok(()) => Ok(config),
                Err(message) => {
                    let span = tree.get_ref().get("idle").map(|table| table.span());
                    Err(invalid(span, Some("idle".into()), message))
                }
            }
        })
}

/// The 1-based line holding byte `offset`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Segment {
    Key(String),
    Index(usize),
}

/// The key path of the key or value at `span`: an exact match first (the deepest), else the
/// deepest value that contains it.
pub(super) fn find_path(table: &DeTable<'_>, span: &Range<usize>) -> Option<Vec<Segment>> {
    fn walk_value(
        value: &toml::Spanned<DeValue<'_>>,
        span: &Range<usize>,
        path: &mut Vec<Segment>,
        exact: &mut Option<Vec<Segment>>,
        within: &mut Option<Vec<Segment>>,
    ) {
        let here = value.span();
        if here == *span {
            if exact.as_ref().is_none_or(|found| found.len() < path.len()) {
                *exact = Some(path.clone());
            }
        } else if here.start <= span.start
            && span.end <= here.end
            && within.as_ref().is_none_or(|found| found.len() < path.len())
        {
            *within = Some(path.clone());
        }
        match value.get_ref() {
            DeValue::Table(table) => walk_table(table, span, path, exact, within),
            DeValue::Array(array) => {
                for (index, item) in array.iter().enumerate() {
                    path.push(Segment::Index(index));
                    walk_value(item, span, path, exact, within);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    fn walk_table(
        table: &DeTable<'_>,
        span: &Range<usize>,
        path: &mut Vec<Segment>,
        exact: &mut Option<Vec<Segment>>,
        within: &mut Option<Vec<Segment>>,
    ) {
        for (key, value) in table.iter() {
            path.push(Segment::Key(key.get_ref().to_string()));
            if key.span() == *span && exact.as_ref().is_none_or(|found| found.len() < path.len()) {
                *exact = Some(path.clone());
            }
            walk_value(value, span, path, exact, within);
            path.pop();
        }
    }
    let (mut exact, mut within) = (None, None);
    walk_table(table, span, &mut Vec::new(), &mut exact, &mut within);
    exact.or(within).filter(|path| !path.is_empty())
}

/// `fraction.gpu."0"`, `protect.commands[1]`: bare keys where TOML allows them and they are
/// not all digits (a GPU index reads better quoted).
pub(super) fn render_path(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&render_key(key));
            }
            Segment::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

pub(super) fn render_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !key.chars().all(|c| c.is_ascii_digit());
    if bare {
        return key.to_string();
    }
    let mut quoted = String::from("\"");
    for c in key.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_control() => quoted.push_str(&format!("\\u{:04X}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// Turns serde's wording into ours, with the key path in front.
pub(super) fn explain(message: &str, key: Option<&str>) -> String {
    let key_prefix = |text: String| match key {
        Some(key) => format!("{key}: {text}"),
        None => text,
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let known: Vec<&str> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|name| !name.is_empty())
            .collect();
        let shown = key.map(str::to_string).unwrap_or_else(|| render_key(name));
        let parent = shown
            .strip_suffix(&render_key(name))
            .and_then(|parent| parent.strip_suffix('.'))
            .filter(|parent| !parent.is_empty());
        let known = match (known.is_empty(), parent) {
            (true, _) => String::new(),
            (false, Some(parent)) => format!(" (known keys in [{parent}]: {})", known.join(", ")),
            (false, None) => format!(" (known keys: {})", known.join(", ")),
        };
        return format!("unknown key '{shown}'{known}");
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.split_once(", expected ")
        {
            return key_prefix(format!(
                "expected {}, found {}",
                expected_words(expected),
                found_words(found)
            ));
        }
    }
    key_prefix(message.to_string())
}

pub(super) fn expected_words(expected: &str) -> String {
    match expected {
        "a sequence" => "an array".to_string(),
        "a map" => "a table".to_string(),
        other if other.starts_with("struct ") => "a table".to_string(),
        other => other.to_string(),
    }
}

pub(super) fn found_words(found: &str) -> String {
    let inner = |text: &str| text.trim_matches('`').to_string();
    match found {
        "map" => "a table".to_string(),
        "sequence" => "an array".to_string(),
        other => match other.split_once(' ') {
            Some(("string", text)) => format!("the string {text}"),
            Some(("integer", number)) => inner(number),
            Some(("floating", rest)) => inner(rest.trim_start_matches("point ")),
            Some(("boolean", value)) => inner(value),
            _ => other.to_string(),
        },
    }
}

/// Checks a share: in (0, 1] and a number.
pub(super) fn check_share(value: f64) -> Result<f64, String> {
    if value.is_nan() {
        Err("nan is not a number: give a share in (0, 1]".to_string())
    } else if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!(
            "{} is out of range: give a share in (0, 1]",
            show_f64(value)
        ))
    }
}

pub(super) fn show_f64(value: f64) -> String {
    if value.is_nan() {
        "nan".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        value.to_string()
    }
}

/// A share as people write it on a command line: `0.8`, `.8`, `1`, or a percentage, `80%`.
/// Zero, negative values, values above 1 (100%), nan, inf and anything else are errors.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    let hint = "give a share in (0, 1], like 0.8, or a percentage, like 80%";
    let not_a_share = || format!("'{text}' is not a share: {hint}");
    let (number, percent) = match trimmed.strip_suffix('%') {
        Some(number) => (number.trim_end(), true),
        None => (trimmed, false),
    };
    // Rust's float syntax also takes "inf", "nan" and "infinity"; only digits, one dot, an
    // exponent and a sign are numbers here.
    let looks_numeric = !number.is_empty()
        && number.chars().any(|c| c.is_ascii_digit())
        && number
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    let value: f64 = match number.parse() {
        Ok(value) if looks_numeric => value,
        _ => return Err(not_a_share()),
    };
    if !value.is_finite() {
        return Err(not_a_share());
    }
    if percent {
        if value > 0.0 && value <= 100.0 {
            Ok(value / 100.0)
        } else {
            Err(format!(
                "'{text}' is out of range: give a percentage in (0%, 100%]"
            ))
        }
    } else if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("'{text}' is out of range: {hint}"))
    }
}

/// Why `key` cannot name a GPU in `[fraction.gpu]`, if it cannot.
pub(super) fn check_gpu_key(key: &str) -> Result<(), String> {
    let index =
        !key.is_empty() && key.chars().all(|c| c.is_ascii_digit()) && key.parse::<u32>().is_ok();
    let uuid = ["GPU-", "MIG-"].iter().any(|prefix| {
        key.len() > prefix.len()
            && key[..prefix.len()].eq_ignore_ascii_case(prefix)
            && key[prefix.len()..]
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == '-' || c == '/')
    });
    if index || uuid {
        Ok(())
    } else {
        Err(
            "not a GPU: name one by index, like \"0\", or by UUID, like \"GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1\" (see nvidia-smi -L)"
                .to_string(),
        )
    }
}

/// Why `name` cannot be a user name, if it cannot. Checks the form only: user databases
/// (LDAP, SSSD) may be unreachable when the watchdog starts, and a config must not fail then.
pub(super) fn check_user_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.starts_with('-')
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, ':' | '/' | ','))
    {
        Err("not a user name".to_string())
    } else {
        Ok(())
    }
}
