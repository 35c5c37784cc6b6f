//! The module picture of every crate has no cycles: no module reaches one that reaches it
//! back (DESIGN.md: "arrows point one way"), neither between top-level modules nor between
//! modules inside a folder (`info::idle` -> `info::table` -> `info::idle`). Read from the
//! source, so a new `use` that closes a loop fails here with the loop named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module of the crate whose sources are `src` -> the modules its non-test code reaches:
/// through `crate::a::b`, `super::x` (from a module's parent), `self::x`, and a child module
/// named bare (`table::view` in `info/mod.rs`), each resolved to the deepest module the path
/// names (`crate::info::table::view` is `info::table`). A module's use of its own folder's
/// `mod.rs` (`super::Log`), as of the crate root, is not counted: a folder's front holds
/// what its parts share, and declares and uses them, as the crate root does its modules.
fn modules(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let sources = sources(src);
    let known: BTreeSet<String> = sources.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (module, text) in &sources {
        // Tests may reach anything; only what the module itself uses counts.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let reached = references(module, code, &known)
            .into_iter()
            .filter(|target| !is_within(module, target))
            .collect();
        graph.insert(module.clone(), reached);
    }
    graph
}

/// Whether `module` is `outer` or one of its parts (`info::idle` is within `info`).
fn is_within(module: &str, outer: &str) -> bool {
    module == outer
        || module
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with("::"))
}

/// Each module's source under `src` by its path (`info::idle` for `info/idle.rs`, `info` for
/// `info/mod.rs` or `info.rs`), but for the crate roots and test-only files (`tests.rs`).
fn sources(src: &Path) -> BTreeMap<String, String> {
    let mut sources = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            // A module's tests in a file of their own (`#[cfg(test)] mod tests;`).
            if path.extension().is_none_or(|ext| ext != "rs") || path.ends_with("tests.rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut segments: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if segments.last().is_some_and(|last| last == "mod") {
                segments.pop();
            }
            // The crate roots (a binary's `main.rs` is another crate).
            if segments == ["lib"] || segments == ["main"] || segments.is_empty() {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            sources.insert(segments.join("::"), text);
        }
    }
    sources
}

/// The modules of `known` that `code`, the source of `module`, names.
fn references(module: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let own: Vec<&str> = module.split("::").collect();
    let children: Vec<&str> = known
        .iter()
        .filter_map(|m| m.strip_prefix(module)?.strip_prefix("::"))
        .filter(|rest| !rest.contains("::"))
        .collect();
    let mut reached = BTreeSet::new();
    for (at, _) in code.char_indices() {
        // Inside a path (`a::crate`), a longer name (`my_crate::`), or `$crate::`.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
            continue;
        }
        let Some((base, rest)) = path_start(&code[at..], &own, &children) else {
            continue;
        };
        let line = &code[code[..at].rfind('\n').map_or(0, |n| n + 1)..at];
        if line.contains("//") {
            continue;
        }
        for path in paths(rest) {
            let full: Vec<&str> = base.iter().copied().chain(path).collect();
            reached.extend(deepest_module(&full, known));
        }
    }
    reached
}

/// Where a path that starts at the head of `text` begins, in module `own` with child
/// modules `children`: the module it is relative to, and the rest of it.
fn path_start<'t>(
    text: &'t str,
    own: &[&'t str],
    children: &[&str],
) -> Option<(Vec<&'t str>, &'t str)> {
    if let Some(rest) = text.strip_prefix("crate::") {
        return Some((Vec::new(), rest));
    }
    if let Some(rest) = text.strip_prefix("self::") {
        return Some((own.to_vec(), rest));
    }
    if text.starts_with("super::") {
        let (mut base, mut rest) = (own.to_vec(), text);
        while let Some(after) = rest.strip_prefix("super::") {
            base.pop();
            rest = after;
        }
        return Some((base, rest));
    }
    let named_child = children.iter().any(|child| {
        text.strip_prefix(child)
            .is_some_and(|rest| rest.starts_with("::"))
    });
    named_child.then(|| (own.to_vec(), text))
}

/// The paths a `use` or an expression names from `rest` on: `a::b::c` is one, `a::{b, c::d}`
/// is `a::b` and `a::c::d`.
fn paths(rest: &str) -> Vec<Vec<&str>> {
    let mut segments = Vec::new();
    let mut rest = rest.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            return top_level_paths(group)
                .into_iter()
                .flat_map(paths)
                .map(|tail| segments.iter().copied().chain(tail).collect())
                .collect();
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(&rest[..end]);
        match rest[end..].strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    vec![segments]
}

/// The deepest module of `known` that `path` (from the crate root) goes through; none for
/// the root's own items.
fn deepest_module(path: &[&str], known: &BTreeSet<String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|module| known.contains(module))
}

/// The top-level modules of `graph`, each reaching what its modules reach.
fn top_level(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let first = |module: &str| module.split("::").next().unwrap().to_string();
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, reached) in graph {
        let names = top.entry(first(module)).or_default();
        names.extend(reached.iter().map(|m| first(m)));
        names.remove(&first(module));
    }
    top
}

/// The top-level picture of the crate whose sources are `src`.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    top_level(&modules(src))
}

/// The paths of a `{a, b::{c, d}}` group, from after its `{`: `a` and `b::{c, d}`.
fn top_level_paths(group: &str) -> Vec<&str> {
    let mut paths = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                paths.push(group[start..at].trim());
                return paths;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                paths.push(group[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    paths.push(group[start..].trim());
    paths
}

fn core_imports() -> BTreeMap<String, BTreeSet<String>> {
    imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// A cycle through `start`, if any, as the modules along it.
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut path = vec![start.to_string()];
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let last = path.last().unwrap().clone();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(graph, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

/// Every cycle in `graph`, one line each.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    graph
        .keys()
        .filter_map(|module| cycle_from(graph, module))
        .map(|cycle| cycle.join(" -> "))
        .collect()
}

#[test]
fn a_group_names_its_top_level_modules_only() {
    assert_eq!(
        top_level_paths("a, b::{c, d}, e::f}; use x::y;"),
        ["a", "b::{c, d}", "e::f"]
    );
}

#[test]
fn no_module_reaches_one_that_reaches_it_back() {
    let graph = core_imports();
    assert!(graph.contains_key("snapshot") && graph.contains_key("sys"));
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "cycles: {cycles:#?}");
}

#[test]
fn nvml_sim_has_no_module_cycle_either() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/src");
    let graph = imports(&src);
    // The loop this holds broken: `mig` and `scenario` both use the leaf `hash`.
    assert!(graph["mig"].contains("hash") && graph["scenario"].contains("hash"));
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "nvml-sim cycles: {cycles:#?}");
}

#[test]
fn the_bottom_layer_uses_nothing_above_it() {
    let graph = core_imports();
    let sys: Vec<&String> = graph["sys"].iter().filter(|m| *m != "pidmap").collect();
    assert!(sys.is_empty(), "sys uses {sys:?}");
}

/// Every crate of the workspace with Rust sources, by its folder under `crates/`.
const CRATES: [&str; 6] = [
    "gpuctl",
    "gpuctl-watchdog",
    "gpuctl-core",
    "nvml-sim",
    "gpuctl-trainer",
    "gpuctl-py",
];

#[test]
fn no_module_of_any_crate_reaches_one_that_reaches_it_back() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for name in CRATES {
        let src = crates.join(name).join("src");
        // A crate moved or renamed fails here rather than passing with nothing read
        // (gpuctl-py's Rust is one file today: no module of its own to check yet).
        let root = ["lib.rs", "main.rs"]
            .iter()
            .any(|root| src.join(root).is_file());
        assert!(root, "{}: no lib.rs or main.rs", src.display());
        let graph = modules(&src);
        let top = top_level(&graph);
        for cycle in cycles(&graph).into_iter().chain(cycles(&top)) {
            found.push(format!("{name}: {cycle}"));
        }
    }
    assert!(found.is_empty(), "cycles: {found:#?}");
}

#[test]
fn a_loop_inside_a_folder_is_found_whichever_way_its_paths_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod info;\nmod render;\n");
    write(
        "info/mod.rs",
        "mod idle;\nmod table;\nuse table::view;\n// idle::nothing\n",
    );
    write(
        "info/idle.rs",
        "use crate::{render, info::{table::stale_for}};\n",
    );
    write("info/table.rs", "fn b() { super::idle::idle_for(); }\n");
    write("info/note.rs", "fn c() { super::Log; self::d(); }\n");
    write(
        "render.rs",
        "use crate::Exit;\n#[cfg(test)]\nuse crate::info;\n",
    );
    let graph = modules(dir.path());
    let reached = |module: &str| graph[module].iter().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(reached("info"), ["info::table"]);
    assert_eq!(reached("info::idle"), ["info::table", "render"]);
    assert_eq!(reached("info::table"), ["info::idle"]);
    // Its folder's front and its own items are no reference.
    assert!(reached("info::note").is_empty());
    assert!(reached("render").is_empty());
    assert_eq!(
        cycles(&graph),
        [
            "info::idle -> info::table -> info::idle",
            "info::table -> info::idle -> info::table"
        ]
    );
    // Folded to the top level, a loop inside a folder is no loop.
    assert!(top_level(&graph)["info"].contains("render"));
    assert!(self::cycles(&top_level(&graph)).is_empty());
}
