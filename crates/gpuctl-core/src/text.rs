//! Text a process or a user chose (a command line, a user, unit or cgroup name, a reason
//! quoting one), made safe to show: every table, log line, drain reason and stderr message of
//! gpuctl and its watchdog goes through [`escape`] (or [`safe`], which also cuts), so that what
//! one user names a process cannot reach another's terminal, `sinfo -R` or the journal raw.
//! JSON documents and the journal's structured fields other than MESSAGE keep the exact text.

use std::borrow::Cow;

/// The most characters of one process-supplied field (a command line, a reason quoting
/// one) that plain output shows: a 100 KiB command line stays one readable row.
pub const FIELD_CAP: usize = 4096;

/// `text` with what could act on a terminal written as escapes, as htop and nvitop do:
/// control characters (C0, DEL, C1), which could move the cursor, retitle or repaint the
/// terminal, hide a line or start a new one, and the bidirectional controls that reorder what
/// is shown, become `\n`, `\t`, `\r`, `\e`, `\x7f`, `\u{9b}`, `\u{202e}`. Borrowed when
/// nothing needs escaping (gpuctl's own text).
pub fn escape(text: &str) -> Cow<'_, str> {
    escape_within(text, usize::MAX)
}

/// [`escape`], then cut to [`FIELD_CAP`] characters (marked `…`): for one field of a table.
pub fn safe(text: &str) -> Cow<'_, str> {
    escape_within(text, FIELD_CAP)
}

/// Whether [`escape`] writes `c` as an escape.
pub fn needs_escape(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

fn escape_within(text: &str, cap: usize) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) && text.len() <= cap {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(cap) + 8);
    for (shown, c) in text.chars().enumerate() {
        if shown >= cap {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x1b' => out.push_str("\\e"),
            c if (c as u32) < 0x80 && needs_escape(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Unicode's explicit directional marks, embeddings, overrides and isolates (U+061C, U+200E,
/// U+200F, U+202A–U+202E, U+2066–U+2069).
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_process_chose_cannot_reach_the_terminal() {
        assert!(matches!(
            safe("python3 train.py --lr 3e-4"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            safe("a\x1b]0;title\x07b\x1b[2Jc\nd\te\r"),
            "a\\e]0;title\\x07b\\e[2Jc\\nd\\te\\r"
        );
        assert_eq!(
            safe("x\u{7f}\u{9b}31m\u{202e}gpj.exe"),
            "x\\x7f\\u{9b}31m\\u{202e}gpj.exe"
        );
        assert_eq!(safe("C:\\path ünïcode ✓ 日本"), "C:\\path ünïcode ✓ 日本");
        let long = "y".repeat(100 * 1024);
        let shown = safe(&long);
        assert_eq!(shown.chars().count(), FIELD_CAP + 1);
        assert!(shown.ends_with('…'));
        assert!(!safe("\u{0}\u{1f}").chars().any(char::is_control));
    }

    #[test]
    fn escape_covers_every_bidi_control_and_does_not_cut() {
        for c in [
            '\u{061c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}',
            '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ] {
            let text = format!("a{c}b");
            assert_eq!(escape(&text), format!("a\\u{{{:x}}}b", c as u32));
        }
        assert_eq!(escape("\u{85}\u{9f}\u{7}"), "\\u{85}\\u{9f}\\x07");
        let long = "y".repeat(FIELD_CAP * 2);
        assert!(matches!(escape(&long), Cow::Borrowed(_)));
        // Marks that are not controls stay: a right-to-left name is shown as written.
        assert_eq!(escape("שלום"), "שלום");
    }

    proptest::proptest! {
        /// Whatever a process puts in its command line, what is printed holds no control
        /// character nor bidirectional control, and no more than the cap (an escape is at
        /// most 8 characters).
        #[test]
        fn nothing_a_process_chose_is_printed_raw(text in proptest::prelude::any::<String>()) {
            let shown = safe(&text);
            proptest::prop_assert!(!shown.chars().any(needs_escape));
            proptest::prop_assert!(shown.chars().count() <= FIELD_CAP * 8 + 1);
            proptest::prop_assert!(!escape(&text).chars().any(needs_escape));
        }
    }
}
