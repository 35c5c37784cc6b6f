//! Terminal presentation: colors, widths and human-readable figures.

use std::io::IsTerminal;

use gpuctl::cli::ColorChoice;

/// How output is decorated. Decided once, from the flags and the environment.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
    pub unicode: bool,
    /// Columns available for a line; `None` when output is not a terminal (nothing is cut).
    pub width: Option<usize>,
    pub terminal: bool,
}

impl Style {
    pub fn choose(choice: ColorChoice) -> Style {
        let terminal = std::io::stdout().is_terminal();
        let env_allows = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            && std::env::var("TERM").map_or(true, |term| term != "dumb");
        let color = match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => terminal && env_allows,
        };
        Style {
            color,
            unicode: locale_is_utf8(),
            width: terminal.then(terminal_width).flatten(),
            terminal,
        }
    }

    pub fn paint(&self, code: Color, text: &str) -> String {
        if self.color && !text.is_empty() {
            format!("\x1b[{}m{text}\x1b[0m", code as u8)
        } else {
            text.to_string()
        }
    }

    /// A bar of `cells` cells, `fraction` of them filled.
    pub fn bar(&self, fraction: f64, cells: usize) -> String {
        bar(self.unicode, fraction, cells)
    }
}

/// A bar of `cells` cells, `fraction` of them filled: block characters, or `#` and `.`
/// where the locale is not UTF-8. The table and `gpuctl top` draw the same bars.
pub fn bar(unicode: bool, fraction: f64, cells: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * cells as f64).round() as usize).min(cells);
    let (full, empty) = if unicode { ("█", "░") } else { ("#", ".") };
    format!("{}{}", full.repeat(filled), empty.repeat(cells - filled))
}

#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub enum Color {
    Bold = 1,
    Dim = 2,
    Red = 31,
    Green = 32,
    Yellow = 33,
}

/// Green below 70 %, yellow below 90 %, red above: how full a GPU is.
pub fn load_color(fraction: f64) -> Color {
    if fraction < 0.70 {
        Color::Green
    } else if fraction < 0.90 {
        Color::Yellow
    } else {
        Color::Red
    }
}

fn locale_is_utf8() -> bool {
    ["LC_ALL", "LC_CTYPE", "LANG"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .is_some_and(|value| {
            let value = value.to_ascii_lowercase();
            value.contains("utf-8") || value.contains("utf8")
        })
}

fn terminal_width() -> Option<usize> {
    // Typed by nix: the ioctl can only be handed a winsize.
    nix::ioctl_read_bad!(window_size, libc::TIOCGWINSZ, libc::winsize);
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ on fd 1 only writes a winsize into `size`, a live local of that
    // type; on a descriptor that is not a terminal it fails (ENOTTY) and writes nothing.
    let ok = unsafe { window_size(libc::STDOUT_FILENO, &mut size) }.is_ok();
    if ok && size.ws_col > 0 {
        return Some(size.ws_col as usize);
    }
    std::env::var("COLUMNS").ok()?.parse().ok()
}

/// Writes a command's result: `document` as pretty JSON, or the text `table` renders. The
/// whole output is rendered first and written once: stdout is line-buffered, and a document
/// written piecewise would cost a syscall per line.
pub fn emit<T: serde::Serialize>(
    json: bool,
    document: &T,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = if json {
        let mut text = pretty_json(document)?;
        text.push(b'\n');
        text
    } else {
        table().into_bytes()
    };
    let mut out = std::io::stdout().lock();
    std::io::Write::write_all(&mut out, &text)?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

/// `document` as serde_json's `to_vec_pretty` writes it.
fn pretty_json<T: serde::Serialize>(document: &T) -> serde_json::Result<Vec<u8>> {
    let mut text = Vec::new();
    document.serialize(&mut serde_json::Serializer::with_formatter(
        &mut text,
        Pretty::default(),
    ))?;
    Ok(text)
}

/// serde_json's pretty layout (two spaces a level), byte for byte, with each line's break
/// and indentation written as one slice: its own formatter writes the indentation a level
/// at a time, and `info --json`'s processes sit four levels deep.
#[derive(Default)]
struct Pretty {
    level: usize,
    has_value: bool,
}

/// The levels whose line break and indentation [`Pretty`] writes as one slice; deeper ones
/// (no gpuctl document has them) are indented a level at a time.
const ONE_SLICE_LEVELS: usize = 32;

/// A comma, a line break, and the indentation of [`ONE_SLICE_LEVELS`] levels.
const LINE: [u8; 2 + 2 * ONE_SLICE_LEVELS] = {
    let mut line = [b' '; 2 + 2 * ONE_SLICE_LEVELS];
    line[0] = b',';
    line[1] = b'\n';
    line
};

impl Pretty {
    fn new_line<W: ?Sized + std::io::Write>(
        &self,
        out: &mut W,
        comma: bool,
    ) -> std::io::Result<()> {
        let start = if comma { 0 } else { 1 };
        if self.level <= ONE_SLICE_LEVELS {
            return out.write_all(&LINE[start..2 + 2 * self.level]);
        }
        out.write_all(&LINE[start..2])?;
        (0..self.level).try_for_each(|_| out.write_all(b"  "))
    }

    /// An array's or an object's opening bracket: one level deeper, nothing in it yet.
    fn open<W: ?Sized + std::io::Write>(
        &mut self,
        out: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        out.write_all(bracket)
    }

    /// Its closing bracket, on a line of its own unless it is empty.
    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        out: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.new_line(out, false)?;
        }
        out.write_all(bracket)
    }
}

impl serde_json::ser::Formatter for Pretty {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, out: &mut W) -> std::io::Result<()> {
        self.open(out, b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, out: &mut W) -> std::io::Result<()> {
        self.close(out, b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        out: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.new_line(out, !first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, out: &mut W) -> std::io::Result<()> {
        self.open(out, b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, out: &mut W) -> std::io::Result<()> {
        self.close(out, b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        out: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.new_line(out, !first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        out: &mut W,
    ) -> std::io::Result<()> {
        out.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// Compact ages as ps and nvitop show them: "45s", "12m", "3h12m", "2d04h".
pub fn age(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// Text a process or a user chose, escaped and cut for a table cell: the one escaping that
/// every log line, drain reason and stderr message shares lives in gpuctl-core.
pub use gpuctl_core::text::safe;

/// Cuts `text` to `width` characters, marking the cut.
pub fn cut(text: &str, width: usize, unicode: bool) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mark = if unicode { "…" } else { "~" };
    let kept: String = text.chars().take(width.saturating_sub(1)).collect();
    format!("{kept}{mark}")
}

/// Cuts a command line to `width` characters in the middle: its start names the program and
/// its end tells processes apart (`--rank 3`), so both stay:
/// `python3 -m torch.distributed.run … --rank 0`. The end is whole words, up to a third of
/// the room; the start fills the rest, ending at a space when one is near.
pub fn cut_middle(text: &str, width: usize, unicode: bool) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= width {
        return text.to_string();
    }
    let mark = if unicode { " … " } else { " ~ " };
    let Some(room) = width.checked_sub(mark.chars().count()).filter(|r| *r >= 2) else {
        return cut(text, width, unicode);
    };
    // The end: whole words from the last, within a third of the room; if even the last
    // word is longer, its last characters.
    let spaces: Vec<usize> = (0..chars.len()).filter(|&i| chars[i] == ' ').collect();
    let tail_len = spaces
        .iter()
        .rev()
        .map(|&at| chars.len() - at - 1)
        .take_while(|&len| len <= room / 3)
        .last()
        .unwrap_or(room / 3)
        .max(1);
    // The start: the rest of the room, back to a space if one is near, else to a break
    // inside a word (`torch.distributed`, not `torch.distributed.ru`).
    let mut head_len = room - tail_len;
    let back_to = |near: usize, is_break: &dyn Fn(char) -> bool| {
        (1..=head_len.min(chars.len() - 1))
            .rev()
            .take(near + 1)
            .find(|&at| is_break(chars[at]))
    };
    if let Some(at) = back_to(12, &|c| c == ' ').or_else(|| back_to(6, &|c| ".,/=:-_".contains(c)))
    {
        head_len = at;
    }
    let head: String = chars[..head_len].iter().collect();
    let tail: String = chars[chars.len() - tail_len..].iter().collect();
    format!("{}{mark}{}", head.trim_end(), tail.trim_start())
}

/// The width of each of a table's first `columns` columns, in chars: its widest cell, or its
/// header where that is wider.
pub fn column_widths<const N: usize>(
    headers: &[String; N],
    rows: &[[String; N]],
    columns: usize,
) -> Vec<usize> {
    (0..columns.min(N))
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([headers[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// Left-aligns `text` in `width` characters (by chars, not bytes).
pub fn pad(text: &str, width: usize) -> String {
    let len = text.chars().count();
    format!("{text}{}", " ".repeat(width.saturating_sub(len)))
}

pub fn pad_left(text: &str, width: usize) -> String {
    let len = text.chars().count();
    format!("{}{text}", " ".repeat(width.saturating_sub(len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_core::units::bytes;

    #[test]
    fn figures_read_like_other_tools() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512 * 1024 * 1024), "512 MiB");
        assert_eq!(bytes(40 * 1024 * 1024 * 1024), "40.0 GiB");
        assert_eq!(age(45), "45s");
        assert_eq!(age(12 * 60 + 5), "12m05s");
        assert_eq!(age(3 * 3600 + 12 * 60), "3h12m");
        assert_eq!(age(2 * 86_400 + 4 * 3600), "2d04h");
    }

    #[test]
    fn json_is_laid_out_as_serde_json_lays_it_out() {
        let mut deep = serde_json::json!([1, {}, []]);
        // Deeper than the formatter's one-slice indentation reaches.
        for level in 0..40 {
            deep = serde_json::json!({ "level": level, "inner": [deep, "a\"b\n"], "empty": {} });
        }
        let documents = [
            serde_json::json!(null),
            serde_json::json!([]),
            serde_json::json!({}),
            serde_json::json!({"a": [1, 2, {"b": null, "c": [[]]}], "é": "x", "n": -1.5}),
            deep,
        ];
        for document in documents {
            assert_eq!(
                String::from_utf8(pretty_json(&document).unwrap()).unwrap(),
                serde_json::to_string_pretty(&document).unwrap()
            );
        }
    }

    #[test]
    fn cutting_counts_characters() {
        assert_eq!(cut("python3 train.py", 8, true), "python3…");
        assert_eq!(cut("short", 8, false), "short");
        assert_eq!(cut("ééééé", 3, false), "éé~");
        assert_eq!(pad("é", 3), "é  ");
    }

    #[test]
    fn a_cut_command_keeps_its_start_and_its_end() {
        let rank = "python3 -m torch.distributed.run --nproc-per-node=4 train.py --model llama-70b --rank 0";
        assert_eq!(cut_middle(rank, 200, true), rank);
        assert_eq!(cut_middle(rank, rank.len(), true), rank);
        for width in [12, 20, 30, 39, 50, 60, 85] {
            let cut = cut_middle(rank, width, true);
            assert!(cut.chars().count() <= width, "{width}: {cut:?}");
            assert!(cut.contains(" … "), "{width}: {cut:?}");
            assert!(cut.ends_with(" 0"), "{width}: {cut:?}");
            assert!(cut.starts_with("python3"), "{width}: {cut:?}");
        }
        assert_eq!(
            cut_middle(rank, 43, true),
            "python3 -m torch.distributed.run … --rank 0"
        );
        assert_eq!(
            cut_middle(rank, 39, true),
            "python3 -m torch.distributed … --rank 0"
        );
        assert_eq!(
            cut_middle(rank, 40, true),
            "python3 -m torch.distributed … --rank 0"
        );
        assert_eq!(
            cut_middle(rank, 52, true),
            "python3 -m torch.distributed.run … --rank 0"
        );
        assert_eq!(
            cut_middle(rank, 43, false),
            "python3 -m torch.distributed.run ~ --rank 0"
        );
        // One long word: characters from both ends.
        let path = "/very/long/path/to/a/program/with/no/spaces/at/all";
        let cut = cut_middle(path, 20, true);
        assert!(cut.chars().count() <= 20, "{cut:?}");
        assert!(cut.starts_with("/very") && cut.ends_with("all"), "{cut:?}");
        // Too narrow for a mark in the middle: cut at the end.
        assert_eq!(cut_middle(rank, 4, true), "pyt…");
    }

    #[test]
    fn bar_fills_in_proportion() {
        let style = Style {
            color: false,
            unicode: false,
            width: None,
            terminal: false,
        };
        assert_eq!(style.bar(0.5, 10), "#####.....");
        assert_eq!(style.bar(2.0, 4), "####");
        assert_eq!(style.bar(f64::NAN, 4).len(), 4);
    }
}
