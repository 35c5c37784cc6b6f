//! Property tests of everything that parses outside input: /proc files (which any process
//! shapes: its command name, its cgroup), configuration files, selectors, sizes and
//! durations. Each must answer with a value or an error for any input, never panic, and
//! read back what it writes. A short run is part of the suite (PROPTEST_CASES, default 256
//! per property); longer runs: `PROPTEST_CASES=100000 cargo test -p gpuctl-core --test fuzz`.

use std::path::Path;

use proptest::prelude::*;

use gpuctl_core::config;
use gpuctl_core::owner::parse_cgroup;
use gpuctl_core::select::OwnerMatch;
use gpuctl_core::sys::procfile::StatLine;
use gpuctl_core::units::{self, parse_amount, parse_duration, parse_size};

/// Text with the characters the parsers treat specially, often.
fn tricky_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("(".to_string()),
            Just(")".to_string()),
            Just(" ".to_string()),
            Just("\n".to_string()),
            Just(":".to_string()),
            Just("/".to_string()),
            Just("=".to_string()),
            Just("\"".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(".".to_string()),
            Just("-".to_string()),
            "[0-9]{1,20}",
            "[a-z_]{1,8}",
            any::<char>().prop_map(String::from),
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn stat_lines_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = StatLine::parse(&bytes);
    }

    #[test]
    fn stat_lines_never_panic_on_lookalikes(text in tricky_text()) {
        let _ = StatLine::parse(text.as_bytes());
        let _ = StatLine::parse(format!("12 ({text}) S 1 2 3 4 5 6").as_bytes());
    }

    /// Whatever a process names itself (comm: any bytes but NUL, up to 15), its stat line
    /// parses back to that name and to the fields after it.
    #[test]
    fn a_stat_line_reads_back_any_command_name(
        comm in "[^\u{0}]{0,15}",
        pid in 1u32..4_194_304,
        ppid in 0i64..4_194_304,
        threads in 1i64..10_000,
        start in any::<u64>(),
    ) {
        let line = format!(
            "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 1 0 0 0 1 1 0 0 20 0 {threads} 0 \
             {start} 1000 50 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n"
        );
        let parsed = StatLine::parse(line.as_bytes()).expect("a well-formed line");
        prop_assert_eq!(parsed.comm, comm);
        prop_assert_eq!(parsed.pid, pid);
        prop_assert_eq!(parsed.ppid, ppid);
        prop_assert_eq!(parsed.num_threads, threads);
        prop_assert_eq!(parsed.starttime, start);
    }

    #[test]
    fn cgroup_files_never_panic(text in tricky_text()) {
        let info = parse_cgroup(&text);
        let _ = info.owner.label();
    }

    #[test]
    fn cgroup_lines_of_any_path_never_panic(path in "(/[a-z0-9_.@:-]{0,20}){0,8}") {
        for line in [format!("0::{path}"), format!("9:memory:{path} (deleted)")] {
            let info = parse_cgroup(&line);
            let _ = info.owner.label();
        }
    }

    #[test]
    fn configuration_text_never_panics(text in tricky_text()) {
        match config::parse(&text, Path::new("/etc/gpuctl/gpuctl.toml")) {
            Ok(_) => {}
            // Every error is one line naming the file.
            Err(error) => {
                let message = error.to_string();
                prop_assert!(!message.contains('\n'), "{}", message);
                prop_assert!(message.contains("gpuctl.toml"), "{}", message);
            }
        }
    }

    #[test]
    fn configuration_values_never_panic(key in "(default|gpu\\.\"[0-9a-zA-Z-]{0,6}\"|user\\.[a-z]{1,6})", value in tricky_text()) {
        let text = format!("[fraction]\n{key} = {value}\n");
        let _ = config::parse(&text, Path::new("/etc/gpuctl/gpuctl.toml"));
        let text = format!("[watchdog]\ngrace = {value}\n");
        let _ = config::parse(&text, Path::new("/etc/gpuctl/gpuctl.toml"));
    }

    #[test]
    fn sizes_amounts_durations_and_owners_never_panic(text in tricky_text()) {
        let _ = parse_size(&text);
        let _ = parse_amount(&text);
        let _ = parse_duration(&text);
        let _ = text.parse::<OwnerMatch>();
        let _ = config::parse_fraction(&text);
    }

    /// A size gpuctl prints in binary units parses back to within its rounding.
    #[test]
    fn printed_sizes_parse_back(bytes in 1024u64..(1u64 << 50)) {
        let shown = units::bytes(bytes).replace(' ', "");
        let parsed = parse_size(&shown).expect("gpuctl reads what it prints") as f64;
        prop_assert!((parsed - bytes as f64).abs() <= bytes as f64 * 0.05 + 1024.0, "{} -> {}", bytes, shown);
    }

    /// The host service's request parser and what it reads of a caller (`gpuctl serve`):
    /// any bytes a client sends get a request or a one-line error.
    #[test]
    fn service_requests_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..5000)) {
        if let Err(error) = gpuctl_core::service::parse_request(&bytes) {
            prop_assert!(!error.is_empty() && !error.contains('\n'), "{:?}", error);
        }
    }

    #[test]
    fn service_requests_never_panic_on_lookalikes(text in tricky_text()) {
        let _ = gpuctl_core::service::parse_request(text.as_bytes());
        let _ = gpuctl_core::service::client::parse_reply(text.as_bytes());
        let _ = gpuctl_core::service::caller::parse_nspid(&text);
        let _ = gpuctl_core::service::caller::parse_uid_map(&text);
    }
}
