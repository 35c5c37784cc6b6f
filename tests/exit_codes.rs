//! The exit-status tables in gpuctl-core against what users read: `--help` and the man pages
//! (generated from `--help`, and committed).

use std::path::Path;
use std::process::Command;

use gpuctl_core::exit::{self, Table};

use crate::util::{gpuctl_bin, watchdog_bin};

fn expected(table: Table) -> Vec<(u8, String)> {
    table
        .iter()
        .map(|(exit, meaning)| {
            let words: Vec<&str> = meaning.split_whitespace().collect();
            (exit.code(), words.join(" "))
        })
        .collect()
}

/// A man page's text with roff's escapes for '-' and '\'' undone.
fn man_page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../man")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("\\-", "-")
        .replace("\\*(Aq", "'")
}

fn help(binary: &Path, args: &[&str]) -> String {
    let out = Command::new(binary).args(args).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn gpuctl_help_and_every_man_page_list_the_table() {
    let want = expected(exit::GPUCTL);
    assert_eq!(exit::parse_help(&help(&gpuctl_bin(), &["--help"])), want);
    for page in [
        "gpuctl.1",
        "gpuctl-info.1",
        "gpuctl-kill.1",
        "gpuctl-clear.1",
        "gpuctl-reset.1",
        "gpuctl-health.1",
        "gpuctl-fraction.1",
        "gpuctl-enable.1",
        "gpuctl-top.1",
    ] {
        assert_eq!(exit::parse_help(&man_page(page)), want, "{page}");
    }
}

#[test]
fn watchdog_help_and_man_page_list_the_table() {
    let want = expected(exit::WATCHDOG);
    assert_eq!(exit::parse_help(&help(&watchdog_bin(), &["--help"])), want);
    assert_eq!(exit::parse_help(&man_page("gpuctl-watchdog.8")), want);
}
