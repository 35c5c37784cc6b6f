//! Sizes and durations as people write them on command lines and in config files, and
//! memory amounts as people read them: the one byte formatter of every binary.

use std::time::Duration;

/// A memory amount, or a share of a GPU's memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    Bytes(u64),
    /// A fraction of total memory, in (0, 1].
    Share(f64),
}

impl Amount {
    pub fn bytes_of(self, total: u64) -> u64 {
        match self {
            Amount::Bytes(bytes) => bytes,
            Amount::Share(share) => (total as f64 * share) as u64,
        }
    }
}

/// "512MiB", "40G", "1.5GB", "1024" (bytes). Binary units (KiB, MiB, GiB, TiB) and their
/// one-letter forms (K, M, G, T) count in powers of 1024, as nvidia-smi's MiB do; KB, MB, GB,
/// TB count in powers of 1000.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (like 512MiB, 40GiB, 1.5GB)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "'{text}': unknown unit '{other}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ));
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is too large"));
    }
    Ok(bytes as u64)
}

/// A size, or a percentage of total memory ("80%").
pub fn parse_amount(text: &str) -> Result<Amount, String> {
    match text.trim().strip_suffix('%') {
        Some(percent) => {
            let value: f64 = percent
                .trim()
                .parse()
                .map_err(|_| format!("'{text}' is not a percentage"))?;
            if !(value > 0.0 && value <= 100.0) {
                return Err(format!("'{text}': a percentage must be in (0, 100]"));
            }
            Ok(Amount::Share(value / 100.0))
        }
        None => parse_size(text).map(Amount::Bytes),
    }
}

/// "10s", "500ms", "1h 30m", or a plain number of seconds ("10", "0.5").
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if let Ok(seconds) = trimmed.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("'{text}' is not a duration (like 10s, 500ms, 2m)"));
    }
    humantime::parse_duration(trimmed)
        .map_err(|_| format!("'{text}' is not a duration (like 10s, 500ms, 2m)"))
}

/// Memory in binary units, as nvidia-smi and free(1) show it: "40.0 GiB", "512 MiB",
/// "12 KiB", "100 B". Every table, log line and message of gpuctl prints memory this way.
pub fn bytes(value: u64) -> String {
    bytes_to(value, 1)
}

/// [`bytes`] with `decimals` digits from GiB up: the trainer shows 2, so that changes of a
/// few MiB in its memory log stay visible ("3.00 GiB").
pub fn bytes_to(value: u64, decimals: usize) -> String {
    const KIB: f64 = 1024.0;
    const MIB: f64 = KIB * 1024.0;
    const GIB: f64 = MIB * 1024.0;
    let v = value as f64;
    if v >= GIB {
        format!("{:.decimals$} GiB", v / GIB)
    } else if v >= MIB {
        format!("{:.0} MiB", v / MIB)
    } else if v >= KIB {
        format!("{:.0} KiB", v / KIB)
    } else {
        format!("{value} B")
    }
}

/// GPU indices as messages and tables list them: "0,1,3".
pub fn gpu_list(indices: &[u32]) -> String {
    indices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The plural ending of a count: "" for one, else `many` ("s", "es").
pub fn plural(count: usize, many: &'static str) -> &'static str {
    if count == 1 { "" } else { many }
}

/// Now, in seconds since the Unix epoch (0 on a clock before it).
pub fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Now, in whole seconds since the Unix epoch: what the state files keep.
pub fn unix_whole_seconds() -> u64 {
    unix_seconds() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("40G").unwrap(), 40 << 30);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size(" 2 gib ").unwrap(), 2 << 30);
        for bad in ["", "abc", "-1G", "1X", "1e999", "GiB", "1..2G"] {
            assert!(parse_size(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn amounts() {
        assert_eq!(parse_amount("80%").unwrap(), Amount::Share(0.8));
        assert_eq!(parse_amount("1GiB").unwrap(), Amount::Bytes(1 << 30));
        assert_eq!(Amount::Share(0.5).bytes_of(1000), 500);
        for bad in ["0%", "101%", "-5%", "x%", "NaN%"] {
            assert!(parse_amount(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        for bad in ["", "-1", "soon", "NaN", "10 parsecs"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn memory_reads_as_nvidia_smi_shows_it() {
        assert_eq!(bytes(40 << 30), "40.0 GiB");
        assert_eq!(bytes(1536 << 20), "1.5 GiB");
        assert_eq!(bytes(512 << 20), "512 MiB");
        assert_eq!(bytes(12 << 10), "12 KiB");
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes_to(3 << 30, 2), "3.00 GiB");
        assert_eq!(bytes_to(320 << 20, 2), "320 MiB");
    }
}
