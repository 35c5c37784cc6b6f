//! The module picture of gpuctl-core has no cycles: no module reaches one that reaches it
//! back (DESIGN.md: "arrows point one way"). Read from the source, so a new `use` that
//! closes a loop fails here with the loop named. nvml-sim's library is held to the same rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module of the crate whose sources are `src` -> the top-level modules its
/// non-test code names through `crate::` (a `crate::{a, b::c}` group names each).
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
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
            let relative = path.strip_prefix(src).unwrap();
            let first = relative.components().next().unwrap().as_os_str();
            let module = first.to_string_lossy().trim_end_matches(".rs").to_string();
            // The crate roots (a binary's `main.rs` is another crate).
            if module == "lib" || module == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Tests may reach anything; only what the library itself uses counts.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let names = graph.entry(module.clone()).or_default();
            for (at, _) in code.match_indices("crate::") {
                let is_comment = code[..at]
                    .rsplit('\n')
                    .next()
                    .is_some_and(|line| line.trim_start().starts_with("//"));
                if is_comment {
                    continue;
                }
                let rest = &code[at + "crate::".len()..];
                let paths = match rest.strip_prefix('{') {
                    Some(group) => top_level_paths(group),
                    None => vec![rest],
                };
                for path in paths {
                    let end = path
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(path.len());
                    let name = &path[..end];
                    if name != module && !name.is_empty() && name != "self" {
                        names.insert(name.to_string());
                    }
                }
            }
        }
    }
    graph
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
