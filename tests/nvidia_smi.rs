//! NVIDIA's own nvidia-smi (535, Debian's build, fetched by scripts/fetch-nvidia-smi) runs
//! unchanged on nvml-sim: every view, on every example scenario in the repository, and what
//! it prints equals what `gpuctl info --json` reads from the same simulated server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::util::{
    Fetch, GIB, Gpu, Proc, Process, Scenario, Sim, gpuctl_bin, repo_root, sim_lib, target_dir,
    wait_until,
};

/// The nvidia-smi binary, fetched once per test run; a test that cannot have it fails with
/// the fetch script's one-line reason.
pub(crate) fn nvidia_smi() -> &'static Path {
    static SMI: Fetch = Fetch::new("fetch-nvidia-smi");
    match SMI.once() {
        Ok(path) => Path::new(path),
        Err(why) => panic!("NVIDIA's nvidia-smi is needed and could not be had: {why}"),
    }
}

fn examples() -> Vec<PathBuf> {
    let dir = repo_root().join("crates/nvml-sim/examples");
    let mut all: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    all.sort();
    assert!(all.len() >= 4, "example scenarios: {all:?}");
    all
}

const QUERY_GPU: &str = "index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,\
utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.mem,\
pstate,compute_mode,persistence_mode";
const QUERY_APPS: &str = "gpu_uuid,pid,process_name,used_memory";
const Q_SECTIONS: &str = "MEMORY,UTILIZATION,TEMPERATURE,POWER,CLOCK,PIDS,ECC,PERFORMANCE";

/// What one run of a scenario printed: each command's stdout and exit status, by name.
struct Views {
    out: BTreeMap<String, (i32, String)>,
}

impl Views {
    fn get(&self, name: &str) -> &(i32, String) {
        self.out
            .get(name)
            .unwrap_or_else(|| panic!("no output named {name}"))
    }

    /// Stdout of a command that must have succeeded.
    fn ok(&self, name: &str) -> &str {
        let (code, text) = self.get(name);
        assert_eq!(*code, 0, "nvidia-smi view {name} failed: {text}");
        text
    }
}

/// Runs every view of nvidia-smi and `gpuctl info --json` inside one `nvml-sim run` of
/// `scenario`, so both read the same stand-in processes. `per_gpu` adds the `-i` views of
/// GPU indices 0..per_gpu, each selected by index, UUID and bus id.
fn run_views(scenario: &Path, per_gpu: usize, trace: Option<&Path>) -> Views {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let script = format!(
        r#"set -u
o="$VIEWS_OUT"
run() {{ name=$1; shift; "$@" >"$o/$name.out" 2>"$o/$name.err"; echo $? >"$o/$name.rc"; }}
run info "$GPUCTL" info --json
run list "$SMI" -L
run default "$SMI"
run q "$SMI" -q
run qd "$SMI" -q -d {Q_SECTIONS}
run csv "$SMI" --query-gpu={QUERY_GPU} --format=csv
run csvn "$SMI" --query-gpu={QUERY_GPU} --format=csv,noheader,nounits
run apps "$SMI" --query-compute-apps={QUERY_APPS} --format=csv
run appsn "$SMI" --query-compute-apps={QUERY_APPS} --format=csv,noheader,nounits
i=0
while [ "$i" -lt {per_gpu} ]; do
    run "idx$i" "$SMI" -i "$i" --query-gpu={QUERY_GPU} --format=csv,noheader,nounits
    run "apps$i" "$SMI" -i "$i" --query-compute-apps={QUERY_APPS} --format=csv,noheader,nounits
    run "q$i" "$SMI" -i "$i" -q -d MEMORY,PIDS
    if [ "$(cat "$o/idx$i.rc")" = 0 ]; then
        uuid=$(cut -d, -f2 "$o/idx$i.out" | tr -d ' ')
        bus=$(cut -d, -f4 "$o/idx$i.out" | tr -d ' ')
        run "uuid$i" "$SMI" -i "$uuid" --query-gpu=index --format=csv,noheader
        run "bus$i" "$SMI" -i "$bus" --query-gpu=index --format=csv,noheader
    fi
    i=$((i + 1))
done
"#
    );
    let mut launcher = Command::new(target_dir().join("nvml-sim"));
    launcher
        .args(["run"])
        .arg(scenario)
        .args(["--", "sh", "-c", &script])
        .env("VIEWS_OUT", out_dir.path())
        .env("SMI", nvidia_smi())
        .env("GPUCTL", gpuctl_bin())
        .env("GPUCTL_CONFIG", "/dev/null");
    match trace {
        Some(file) => launcher.env("NVML_SIM_TRACE", file),
        None => launcher.env_remove("NVML_SIM_TRACE"),
    };
    // What the launcher says (h200x8.toml's users do not exist here) is shown only when
    // the run fails: a passing run's log stays clean.
    let run = launcher.output().expect("run nvml-sim");
    assert!(
        run.status.success(),
        "nvml-sim run {}: {}",
        scenario.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(out_dir.path()).expect("outputs") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "out") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).expect("read output");
            let text = String::from_utf8(bytes.clone()).unwrap_or_else(|_| {
                panic!(
                    "{}: {name} printed bytes that are not UTF-8: {:?}",
                    scenario.display(),
                    String::from_utf8_lossy(&bytes)
                )
            });
            let code: i32 = std::fs::read_to_string(path.with_extension("rc"))
                .expect("exit status")
                .trim()
                .parse()
                .expect("numeric status");
            let err = std::fs::read_to_string(path.with_extension("err")).unwrap_or_default();
            assert!(
                !err.contains("panicked") && !err.contains("Segmentation"),
                "{name}: {err}"
            );
            out.insert(name, (code, text));
        }
    }
    Views { out }
}

fn gpu_count(scenario: &Path) -> usize {
    std::fs::read_to_string(scenario)
        .expect("scenario")
        .lines()
        .filter(|l| l.trim_start().starts_with("[[gpu]]"))
        .count()
}

fn mib(bytes: &Value) -> u64 {
    bytes.as_u64().expect("bytes") / (1024 * 1024)
}

/// nvidia-smi's compute-mode and persistence words for gpuctl's JSON values.
fn compute_mode_word(mode: &str) -> &'static str {
    match mode {
        "default" => "Default",
        "exclusive_process" => "Exclusive_Process",
        "prohibited" => "Prohibited",
        "exclusive_thread" => "Exclusive_Thread",
        other => panic!("compute mode {other}"),
    }
}

fn watts(mw: &Value) -> String {
    format!("{:.2}", mw.as_u64().expect("milliwatts") as f64 / 1000.0)
}

/// The `--query-gpu` fields, in QUERY_GPU's order, as gpuctl's JSON gives them for `d`
/// (nounits form).
fn expected_gpu_row(d: &Value) -> Vec<String> {
    let m = &d["memory"];
    vec![
        d["index"].to_string(),
        d["uuid"].as_str().unwrap().to_string(),
        d["name"].as_str().unwrap().to_string(),
        d["pci_bus_id"].as_str().unwrap().to_string(),
        mib(&m["total_bytes"]).to_string(),
        mib(&m["used_bytes"]).to_string(),
        mib(&m["free_bytes"]).to_string(),
        // MIG gives no utilization: nvidia-smi prints [N/A], gpuctl null.
        or_na(&d["utilization"]["gpu_pct"], "[N/A]"),
        or_na(&d["utilization"]["memory_pct"], "[N/A]"),
        d["temperature_c"].to_string(),
        watts(&d["power_mw"]),
        watts(&d["power_limit_mw"]),
        d["clocks"]["sm_mhz"].to_string(),
        d["clocks"]["memory_mhz"].to_string(),
        d["pstate"].as_str().unwrap().to_string(),
        compute_mode_word(d["compute_mode"].as_str().unwrap()).to_string(),
        if d["persistence_mode"].as_bool().unwrap() {
            "Enabled"
        } else {
            "Disabled"
        }
        .to_string(),
    ]
}

/// A JSON value as nvidia-smi prints it, `na` where gpuctl has null.
fn or_na(value: &Value, na: &str) -> String {
    if value.is_null() {
        na.to_string()
    } else {
        value.to_string()
    }
}

fn csv_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(", ").map(|f| f.trim().to_string()).collect())
        .collect()
}

/// gpuctl's compute processes of `d`, as `(pid, argv[0], used MiB or None)`, by pid.
fn expected_apps(d: &Value) -> Vec<(u64, String, Option<u64>)> {
    let mut apps: Vec<(u64, String, Option<u64>)> = d["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"].as_str().unwrap().contains("compute"))
        .map(|p| {
            (
                p["pid"].as_u64().unwrap(),
                p["argv"][0].as_str().unwrap().to_string(),
                p["used_bytes"].as_u64().map(|b| b / (1024 * 1024)),
            )
        })
        .collect();
    apps.sort();
    apps
}

/// `--query-compute-apps` rows (nounits) of one GPU, as `(pid, name, used MiB)`, by pid.
fn smi_apps(rows: &[Vec<String>], uuid: &str) -> Vec<(u64, String, Option<u64>)> {
    let mut apps: Vec<(u64, String, Option<u64>)> = rows
        .iter()
        .filter(|r| r[0] == uuid)
        .map(|r| (r[1].parse().unwrap(), r[2].clone(), r[3].parse().ok()))
        .collect();
    apps.sort();
    apps
}

/// `-q` output: for each GPU block (by bus id), the `key : value` lines, with the section
/// path as a prefix ("FB Memory Usage/Used"), and the process entries.
struct QView {
    gpus: BTreeMap<String, BTreeMap<String, String>>,
    processes: BTreeMap<String, Vec<BTreeMap<String, String>>>,
}

fn parse_q(text: &str) -> QView {
    let mut gpus = BTreeMap::new();
    let mut processes: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut sections: Vec<(usize, String)> = Vec::new();
    for line in text.lines() {
        if let Some(bus) = line.strip_prefix("GPU ") {
            current = Some(bus.trim().to_string());
            gpus.insert(bus.trim().to_string(), BTreeMap::new());
            sections.clear();
            continue;
        }
        let Some(bus) = current.clone() else { continue };
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        while sections.last().is_some_and(|(i, _)| *i >= indent) {
            sections.pop();
        }
        match trimmed.split_once(" : ") {
            None => {
                let name = trimmed.trim_end_matches(':').trim().to_string();
                if name == "Process ID" {
                    continue;
                }
                sections.push((indent, name));
            }
            Some((key, value)) => {
                let key = key.trim();
                let value = value.trim().to_string();
                let in_processes = sections.iter().any(|(_, s)| s == "Processes");
                if in_processes {
                    let list = processes.entry(bus.clone()).or_default();
                    if key == "GPU instance ID" || list.is_empty() {
                        list.push(BTreeMap::new());
                    }
                    list.last_mut().unwrap().insert(key.to_string(), value);
                } else {
                    let path: Vec<&str> = sections.iter().map(|(_, s)| s.as_str()).collect();
                    let full = if path.is_empty() {
                        key.to_string()
                    } else {
                        format!("{}/{key}", path.join("/"))
                    };
                    gpus.get_mut(&bus).unwrap().insert(full, value);
                }
            }
        }
    }
    QView { gpus, processes }
}

/// `-q` (whole or `-d` sections) agrees with gpuctl's JSON for device `d`, on every field
/// the view prints.
fn assert_q_agrees(q: &QView, d: &Value, what: &str) {
    let bus = d["pci_bus_id"].as_str().unwrap();
    let g = q
        .gpus
        .get(bus)
        .unwrap_or_else(|| panic!("{what}: no GPU {bus} in -q"));
    let expect = |key: &str, value: String| {
        if let Some(got) = g.get(key) {
            assert_eq!(got, &value, "{what}: GPU {bus} {key}");
        }
    };
    let m = &d["memory"];
    expect(
        "FB Memory Usage/Total",
        format!("{} MiB", mib(&m["total_bytes"])),
    );
    expect(
        "FB Memory Usage/Used",
        format!("{} MiB", mib(&m["used_bytes"])),
    );
    expect(
        "FB Memory Usage/Free",
        format!("{} MiB", mib(&m["free_bytes"])),
    );
    expect(
        "FB Memory Usage/Reserved",
        format!("{} MiB", mib(&m["reserved_bytes"])),
    );
    expect("Product Name", d["name"].as_str().unwrap().to_string());
    expect("GPU UUID", d["uuid"].as_str().unwrap().to_string());
    let util = |v: &Value| {
        if v.is_null() {
            "N/A".to_string()
        } else {
            format!("{v} %")
        }
    };
    expect("Utilization/Gpu", util(&d["utilization"]["gpu_pct"]));
    expect("Utilization/Memory", util(&d["utilization"]["memory_pct"]));
    expect(
        "Temperature/GPU Current Temp",
        format!("{} C", d["temperature_c"]),
    );
    expect(
        "GPU Power Readings/Power Draw",
        format!("{} W", watts(&d["power_mw"])),
    );
    expect(
        "GPU Power Readings/Current Power Limit",
        format!("{} W", watts(&d["power_limit_mw"])),
    );
    expect("Clocks/SM", format!("{} MHz", d["clocks"]["sm_mhz"]));
    expect(
        "Clocks/Memory",
        format!("{} MHz", d["clocks"]["memory_mhz"]),
    );
    expect(
        "Performance State",
        d["pstate"].as_str().unwrap().to_string(),
    );
    expect(
        "Compute Mode",
        compute_mode_word(d["compute_mode"].as_str().unwrap()).to_string(),
    );
    let persistence = if d["persistence_mode"].as_bool().unwrap() {
        "Enabled"
    } else {
        "Disabled"
    };
    expect("Persistence Mode", persistence.to_string());

    // PIDS: the processes block lists compute and graphics processes alike.
    if g.contains_key("FB Memory Usage/Used") || q.processes.contains_key(bus) {
        let mut got: Vec<(u64, String, Option<u64>)> = q
            .processes
            .get(bus)
            .map(|list| {
                list.iter()
                    .map(|p| {
                        (
                            p["Process ID"].parse().unwrap(),
                            p["Name"].clone(),
                            p["Used GPU Memory"]
                                .strip_suffix(" MiB")
                                .and_then(|v| v.parse().ok()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        got.sort();
        let mut want: Vec<(u64, String, Option<u64>)> = d["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["pid"].as_u64().unwrap(),
                    p["argv"][0].as_str().unwrap().to_string(),
                    p["used_bytes"].as_u64().map(|b| b / (1024 * 1024)),
                )
            })
            .collect();
        want.sort();
        assert_eq!(got, want, "{what}: GPU {bus} processes");
    }
}

/// The default view: each GPU's two table rows, and the processes table.
fn assert_default_view_agrees(text: &str, devices: &[Value]) {
    let rows: Vec<&str> = text.lines().collect();
    for d in devices {
        let bus = d["pci_bus_id"].as_str().unwrap();
        let at = rows
            .iter()
            .position(|l| l.contains(bus))
            .unwrap_or_else(|| panic!("default view: no row for {bus}:\n{text}"));
        let first: Vec<&str> = rows[at].split_whitespace().collect();
        assert_eq!(
            first[1],
            d["index"].to_string(),
            "index of {bus}: {}",
            rows[at]
        );
        let name = d["name"].as_str().unwrap();
        assert!(rows[at].contains(name), "name of {bus}: {}", rows[at]);
        let persistence = if d["persistence_mode"].as_bool().unwrap() {
            "On"
        } else {
            "Off"
        };
        let first_cell = rows[at].split('|').nth(1).unwrap_or_default().trim();
        assert!(
            first_cell.ends_with(&format!(" {persistence}")),
            "persistence of {bus}: {}",
            rows[at]
        );
        let second = rows[at + 1];
        let want_temp = format!(" {}C ", d["temperature_c"]);
        assert!(
            second.contains(&want_temp),
            "temperature of {bus}: {second}"
        );
        let pstate = format!(" {} ", d["pstate"].as_str().unwrap());
        assert!(second.contains(&pstate), "pstate of {bus}: {second}");
        let power = format!(
            "{}W / {}W",
            (d["power_mw"].as_u64().unwrap() as f64 / 1000.0).round(),
            (d["power_limit_mw"].as_u64().unwrap() as f64 / 1000.0).round()
        );
        assert!(
            second.contains(&power),
            "power of {bus} ({power}): {second}"
        );
        let used = format!(" {}MiB / ", mib(&d["memory"]["used_bytes"]));
        assert!(second.contains(&used), "memory of {bus} ({used}): {second}");
        let util = match &d["utilization"]["gpu_pct"] {
            Value::Null => " N/A ".to_string(),
            pct => format!(" {pct}% "),
        };
        assert!(second.contains(&util), "utilization of {bus}: {second}");
        // The default view's narrow column shortens the long names ("E. Process").
        let mode = match compute_mode_word(d["compute_mode"].as_str().unwrap()) {
            "Exclusive_Process" => "E. Process",
            "Exclusive_Thread" => "E. Thread",
            word => word,
        };
        assert!(second.contains(mode), "compute mode of {bus}: {second}");
    }
    // Processes table: "|    0   N/A  N/A     27841      C   python3     40960MiB |".
    // nvidia-smi 535 cuts a usage of six digits to its first five and "...".
    let mut got: Vec<(u64, u64, String, String)> = Vec::new();
    let table = text.split("Processes:").nth(1).expect("a processes table");
    for line in table.lines() {
        let fields: Vec<&str> = line
            .trim_matches(|c| c == '|' || c == ' ')
            .split_whitespace()
            .collect();
        if fields.len() >= 7 && fields[0].parse::<u64>().is_ok() && fields[3].parse::<u64>().is_ok()
        {
            got.push((
                fields[0].parse().unwrap(),
                fields[3].parse().unwrap(),
                fields[5..fields.len() - 1].join(" "),
                fields[fields.len() - 1].to_string(),
            ));
        }
    }
    got.sort();
    let mut want: Vec<(u64, u64, String, Option<u64>)> = devices
        .iter()
        .flat_map(|d| {
            let index = d["index"].as_u64().unwrap();
            d["processes"].as_array().unwrap().iter().map(move |p| {
                (
                    index,
                    p["pid"].as_u64().unwrap(),
                    p["argv"][0].as_str().unwrap().to_string(),
                    p["used_bytes"].as_u64().map(|b| b / (1024 * 1024)),
                )
            })
        })
        .collect();
    want.sort();
    assert_eq!(got.len(), want.len(), "default view processes:\n{text}");
    for (got, want) in got.iter().zip(&want) {
        assert_eq!(
            (got.0, got.1, &got.2),
            (want.0, want.1, &want.2),
            "default view process:\n{text}"
        );
        let usage = match want.3 {
            Some(used) => format!("{used}MiB"),
            None => "N/A".to_string(),
        };
        match got.3.strip_suffix("...") {
            Some(cut) => assert!(usage.starts_with(cut), "{usage} shown as {}", got.3),
            None => assert_eq!(got.3, usage, "usage of pid {}", got.1),
        }
    }
}

#[test]
fn nvidia_smi_views_agree_with_gpuctl_on_every_example_scenario() {
    for scenario in examples() {
        let name = scenario.file_name().unwrap().to_string_lossy().into_owned();
        let count = gpu_count(&scenario);
        let views = run_views(&scenario, count, None);
        let (info_code, info_text) = views.get("info");
        if *info_code == 3 {
            // No driver: both say so. gpuctl exits 3; nvidia-smi with NVML's code (9).
            assert_eq!(*info_code, 3, "{name}: gpuctl info: {info_text}");
            for view in ["list", "default", "q", "csv", "apps"] {
                let (code, _) = views.get(view);
                assert_eq!(*code, 9, "{name}: nvidia-smi {view} without a driver");
            }
            continue;
        }
        // Exit status 1: a GPU is not ok (lost); the document still describes every GPU.
        assert!(
            *info_code == 0 || *info_code == 1,
            "{name}: gpuctl info: {info_code}"
        );
        let info: Value = serde_json::from_str(info_text).expect("info JSON");
        let devices = info["devices"].as_array().unwrap();
        assert_eq!(devices.len(), count, "{name}: gpuctl's GPU count");
        let ok: Vec<Value> = devices
            .iter()
            .filter(|d| d["status"] == "ok")
            .cloned()
            .collect();
        let lost: Vec<u64> = devices
            .iter()
            .filter(|d| d["status"] == "lost")
            .map(|d| d["index"].as_u64().unwrap())
            .collect();

        // -L names every GPU gpuctl reads, with its UUID; a lost GPU is reported as lost.
        let list = &views.get("list").1;
        for d in &ok {
            let line = format!(
                "GPU {}: {} (UUID: {})",
                d["index"],
                d["name"].as_str().unwrap(),
                d["uuid"].as_str().unwrap()
            );
            assert!(list.contains(&line), "{name}: -L lacks {line:?}:\n{list}");
        }

        // Each GPU selected alone, by index, UUID and bus id.
        for d in devices {
            let i = d["index"].as_u64().unwrap();
            let (code, text) = views.get(&format!("idx{i}"));
            if lost.contains(&i) {
                // nvidia-smi exits with NVML_ERROR_GPU_IS_LOST, as on a real server.
                assert_eq!(*code, 15, "{name}: -i {i} on a lost GPU: {text}");
                continue;
            }
            assert_eq!(*code, 0, "{name}: -i {i}: {text}");
            let rows = csv_rows(text);
            assert_eq!(
                rows,
                vec![expected_gpu_row(d)],
                "{name}: GPU {i} --query-gpu"
            );
            for by in ["uuid", "bus"] {
                let (code, text) = views.get(&format!("{by}{i}"));
                if *code != 0 && !lost.is_empty() {
                    // nvidia-smi walks the GPUs to match a UUID or bus id, and stops at a
                    // lost one on its way, as it does on real hardware.
                    assert!(text.contains("GPU is lost"), "{name}: -i by {by}: {text}");
                    continue;
                }
                assert_eq!(*code, 0, "{name}: -i by {by} of GPU {i}: {text}");
                assert_eq!(text.trim(), i.to_string(), "{name}: -i by {by} of GPU {i}");
            }
            let apps = csv_rows(views.ok(&format!("apps{i}")));
            let uuid = d["uuid"].as_str().unwrap();
            assert_eq!(
                smi_apps(&apps, uuid),
                expected_apps(d),
                "{name}: GPU {i} --query-compute-apps"
            );
            assert_q_agrees(&parse_q(views.ok(&format!("q{i}"))), d, &name);
        }

        if !lost.is_empty() {
            // Whole-server views stop at the lost GPU, as nvidia-smi does on real hardware.
            let (code, _) = views.get("default");
            assert_eq!(*code, 15, "{name}: the default view with a lost GPU");
            continue;
        }

        // The whole server at once.
        let header = views.ok("csv").lines().next().unwrap().to_string();
        assert!(
            header.starts_with("index, uuid, name, pci.bus_id, memory.total [MiB]"),
            "{name}: {header}"
        );
        let with_units = csv_rows(views.ok("csv"));
        let plain = csv_rows(views.ok("csvn"));
        let want: Vec<Vec<String>> = devices.iter().map(expected_gpu_row).collect();
        assert_eq!(plain, want, "{name}: --query-gpu (noheader,nounits)");
        assert_eq!(with_units.len(), want.len() + 1, "{name}: csv rows");
        for (row, want) in with_units[1..].iter().zip(&want) {
            assert_eq!(row[5], format!("{} MiB", want[5]), "{name}: memory.used");
            assert_eq!(row[10], format!("{} W", want[10]), "{name}: power.draw");
        }
        let apps = csv_rows(views.ok("appsn"));
        let listed: usize = devices.iter().map(|d| expected_apps(d).len()).sum();
        assert_eq!(apps.len(), listed, "{name}: --query-compute-apps rows");
        for d in devices {
            assert_eq!(
                smi_apps(&apps, d["uuid"].as_str().unwrap()),
                expected_apps(d),
                "{name}: --query-compute-apps of GPU {}",
                d["index"]
            );
        }
        let q = parse_q(views.ok("q"));
        let qd = parse_q(views.ok("qd"));
        assert_eq!(q.gpus.len(), count, "{name}: -q GPU blocks");
        for d in devices {
            assert_q_agrees(&q, d, &format!("{name} -q"));
            assert_q_agrees(&qd, d, &format!("{name} -q -d"));
        }
        assert_default_view_agrees(views.ok("default"), devices);
        assert_mig_agrees(views.ok("list"), views.ok("default"), devices, &name);
    }
}

/// On MIG-enabled GPUs: `-L` names each MIG device with its profile and UUID under its GPU,
/// and the default view's "MIG devices" table gives each instance's ids and memory, as
/// gpuctl reads them.
fn assert_mig_agrees(list: &str, default: &str, devices: &[Value], name: &str) {
    // "|  0    1   0   0  |           30720MiB / 40448MiB  | ..."
    let mut rows: Vec<(u64, u64, u64, u64, u64)> = Vec::new();
    if let Some(table) = default.split("MIG devices:").nth(1) {
        let table = table.split("Processes:").next().unwrap_or_default();
        for line in table.lines() {
            let cells: Vec<&str> = line.split('|').collect();
            if cells.len() < 3 {
                continue;
            }
            let ids: Vec<u64> = cells[1]
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            let memory: Vec<u64> = cells[2]
                .split('/')
                .filter_map(|w| w.trim().strip_suffix("MiB")?.trim().parse().ok())
                .collect();
            if ids.len() == 4 && memory.len() == 2 {
                rows.push((ids[0], ids[1], ids[2], memory[0], memory[1]));
            }
        }
    }
    let mut want: Vec<(u64, u64, u64, u64, u64)> = Vec::new();
    for d in devices {
        let migs = d["mig_devices"].as_array().expect("mig_devices");
        for m in migs {
            let line = format!("MIG {}", m["profile"].as_str().expect("a profile"));
            let uuid = format!("(UUID: {})", m["uuid"].as_str().unwrap());
            assert!(
                list.lines().any(|l| l.contains(&line) && l.contains(&uuid)),
                "{name}: -L lacks {line} {uuid}:\n{list}"
            );
            want.push((
                d["index"].as_u64().unwrap(),
                m["gpu_instance_id"].as_u64().unwrap(),
                m["compute_instance_id"].as_u64().unwrap(),
                mib(&m["memory"]["used_bytes"]),
                mib(&m["memory"]["total_bytes"]),
            ));
        }
    }
    rows.sort();
    want.sort();
    assert_eq!(rows, want, "{name}: the MIG devices table:\n{default}");
}

/// The calls nvidia-smi makes that the sim leaves unanswered (NOT_SUPPORTED), because an
/// HGX H100/H200 on driver 535 leaves them unanswered too: nvidia-smi prints N/A for each.
const UNANSWERED_ON_HGX_HOPPER: &[(&str, &str)] = &[
    ("nvmlDeviceGetDriverModel", "WDDM/TCC: Windows only"),
    (
        "nvmlDeviceGetGpuOperationMode",
        "GPU operation modes: GeForce Titan and Kepler Tesla only",
    ),
    ("nvmlDeviceGetHostVgpuMode", "vGPU hosts only"),
    ("nvmlDeviceGetGridLicensableFeatures_v4", "vGPU guests only"),
    (
        "nvmlDeviceGetLastBBXFlushTime",
        "no InfoROM BBX flush recorded",
    ),
    (
        "nvmlDeviceGetBridgeChipInfo",
        "SXM modules carry no bridge chip",
    ),
    (
        "nvmlDeviceGetAutoBoostedClocksEnabled",
        "auto boost is not user-controllable on data-center GPUs since Volta",
    ),
    (
        "nvmlDeviceGetRetiredPages",
        "Ampere and later remap rows instead of retiring pages",
    ),
    (
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "Ampere and later remap rows instead of retiring pages",
    ),
    (
        "export table slot 165",
        "the IBM NPU relaxed-ordering mode: POWER hosts only",
    ),
    (
        "export table slot 226",
        "PCIe atomic capabilities: N/A on HGX",
    ),
    (
        "export table slot 232",
        "deferred memory clocks: none pending",
    ),
    ("export table slot 237", "the FRU part number of OEM boards"),
];

#[test]
fn nvml_sim_trace_names_no_call_a_real_hopper_driver_would_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.log");
    for scenario in examples() {
        let count = gpu_count(&scenario).min(2);
        run_views(&scenario, count, Some(&trace));
    }
    let text = std::fs::read_to_string(&trace).expect("the trace was written");
    let mut unanswered: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("nvml-sim: trace: "))
        .filter_map(|l| l.strip_suffix(": not-modelled"))
        .collect();
    unanswered.sort();
    unanswered.dedup();
    let expected: Vec<&str> = UNANSWERED_ON_HGX_HOPPER.iter().map(|(n, _)| *n).collect();
    let gaps: Vec<&&str> = unanswered
        .iter()
        .filter(|n| !expected.contains(n))
        .collect();
    assert!(
        gaps.is_empty(),
        "nvidia-smi called what a real driver answers and the sim does not model: {gaps:?}"
    );
    let stale: Vec<&&str> = expected
        .iter()
        .filter(|n| !unanswered.contains(n))
        .collect();
    assert!(
        stale.is_empty(),
        "listed as unanswered but never called (the list is stale): {stale:?}"
    );
    // Defaults are traced too: the map of what no scenario key sets.
    assert!(text.contains("nvmlDeviceGetEccMode: default"), "{text}");
}

/// A directory holding libnvidia-ml.so.1 → the built sim, for nvidia-smi to load.
pub(crate) fn lib_dir(sim: &Sim) -> PathBuf {
    let dir = sim.dir.path().join("lib");
    std::fs::create_dir_all(&dir).expect("lib dir");
    let link = dir.join("libnvidia-ml.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(sim_lib(), &link).expect("symlink");
    }
    dir
}

fn smi(sim: &Sim, args: &[&str]) -> String {
    let out = Command::new(nvidia_smi())
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir(sim))
        .env("NVML_SIM_SCENARIO", sim.scenario_path())
        .env("NVML_SIM_STATE", sim.state_path())
        .output()
        .expect("run nvidia-smi");
    assert!(
        out.status.success(),
        "nvidia-smi {args:?}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn live_scenario_edits_and_process_deaths_show_in_both_on_the_next_call() {
    let job = Proc::spawn_ready("sleep", "python3", &["train.py"]);
    let scenario = |leaked: u64| {
        Scenario::new()
            .gpu(Gpu::new().leaked(leaked))
            .process(Process::new(job.pid()).used(20 * GIB))
    };
    let sim = Sim::new(&scenario(8 * GIB));
    let used = |sim: &Sim| -> (u64, u64) {
        let row = smi(
            sim,
            &["--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        );
        let info = sim.json(&["info"]);
        (
            row.trim().parse().expect("MiB"),
            mib(&info["devices"][0]["memory"]["used_bytes"]),
        )
    };
    assert_eq!(used(&sim), (20480 + 8192, 20480 + 8192));

    // The leak is freed: both see it on their next call.
    sim.write(&scenario(0));
    assert_eq!(used(&sim), (20480, 20480));

    // The process dies: nvidia-smi lists no process and the memory is free; gpuctl agrees.
    let pid = job.pid();
    let apps = smi(&sim, &["--query-compute-apps=pid", "--format=csv,noheader"]);
    assert_eq!(apps.trim(), pid.to_string());
    let mut job = job;
    job.kill();
    wait_until(std::time::Duration::from_secs(5), || {
        smi(&sim, &["--query-compute-apps=pid", "--format=csv,noheader"])
            .trim()
            .is_empty()
    });
    assert_eq!(used(&sim), (0, 0));
    let info = sim.json(&["info"]);
    assert_eq!(info["devices"][0]["processes"], serde_json::json!([]));
}

/// The rehearsal of docs/guide/rehearse.md: a site epilog that parses nvidia-smi, run by `nvml-sim run` with
/// the nvidia-smi it finds (on PATH, else the cached one), on the 8-GPU example and on an
/// idle server.
#[test]
fn readme_epilog_rehearsal_parses_nvidia_smi_on_the_simulated_server() {
    let cache_dir = nvidia_smi().parent().unwrap().to_path_buf();
    let epilog = repo_root().join("crates/nvml-sim/examples/epilog-nvidia-smi.sh");
    let rehearse = |scenario: &Path| {
        let out = Command::new(target_dir().join("nvml-sim"))
            .arg("run")
            .arg(scenario)
            .args(["--", "sh"])
            .arg(&epilog)
            // Only the cache holds nvidia-smi: the launcher must find it there.
            .env("PATH", "/usr/bin:/bin")
            .env("GPUCTL_CACHE", cache_dir.parent().unwrap())
            .output()
            .expect("run nvml-sim");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = rehearse(&repo_root().join("crates/nvml-sim/examples/h200x8.toml"));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("epilog: 27 GPU processes left:"), "{err}");
    assert!(err.contains("00000000:18:00.0, "), "{err}");

    let idle = Sim::new("[[gpu]]\n[[gpu]]\n");
    let (code, out, err) = rehearse(&idle.scenario_path());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "epilog: GPUs free\n");
}

/// The health sections of `nvidia-smi -q` (ECC errors, retired pages, remapped rows, clock
/// event reasons) show what the scenario gives each GPU: a sick one, and a healthy one
/// beside it (no retired-pages key: N/A, as Hopper answers).
#[test]
fn nvidia_smi_shows_the_scenarios_remapped_rows_ecc_retired_pages_and_clock_events() {
    let sim = Sim::new(
        &Scenario::new().gpu(Gpu::new().utilization(50)).gpu(
            Gpu::new()
                .recovery_action("gpu_reset")
                .remapped_rows(3, 1, true, false)
                .ecc([0, 2, 10, 2])
                .retired_pages(0, 1, true)
                .clock_event_reasons(&["hw_slowdown", "sw_thermal_slowdown"]),
        ),
    );
    let q = parse_q(&smi(
        &sim,
        &["-q", "-d", "ECC,ROW_REMAPPER,PAGE_RETIREMENT,PERFORMANCE"],
    ));
    let gpu = |index: usize| {
        let bus = q.gpus.keys().nth(index).expect("two GPUs");
        &q.gpus[bus]
    };
    let sick = gpu(1);
    let want = [
        ("ECC Errors/Volatile/DRAM Correctable", "0"),
        ("ECC Errors/Volatile/DRAM Uncorrectable", "2"),
        ("ECC Errors/Aggregate/DRAM Correctable", "10"),
        ("ECC Errors/Aggregate/DRAM Uncorrectable", "2"),
        ("Retired Pages/Single Bit ECC", "0"),
        ("Retired Pages/Double Bit ECC", "1"),
        ("Retired Pages/Pending Page Blacklist", "Yes"),
        ("Remapped Rows/Correctable Error", "3"),
        ("Remapped Rows/Uncorrectable Error", "1"),
        ("Remapped Rows/Pending", "Yes"),
        ("Remapped Rows/Remapping Failure Occurred", "No"),
        ("Clocks Event Reasons/Idle", "Not Active"),
        ("Clocks Event Reasons/HW Slowdown", "Active"),
        ("Clocks Event Reasons/SW Thermal Slowdown", "Active"),
        ("Clocks Event Reasons/HW Thermal Slowdown", "Not Active"),
    ];
    for (key, value) in want {
        assert_eq!(
            sick.get(key).map(String::as_str),
            Some(value),
            "{key}: {sick:#?}"
        );
    }
    let healthy = gpu(0);
    let want = [
        ("ECC Errors/Volatile/DRAM Uncorrectable", "0"),
        ("ECC Errors/Aggregate/DRAM Correctable", "0"),
        ("Retired Pages/Double Bit ECC", "N/A"),
        ("Retired Pages/Pending Page Blacklist", "N/A"),
        ("Remapped Rows/Pending", "No"),
        ("Remapped Rows/Uncorrectable Error", "0"),
        ("Clocks Event Reasons/HW Slowdown", "Not Active"),
        ("Clocks Event Reasons/Idle", "Not Active"),
    ];
    for (key, value) in want {
        assert_eq!(
            healthy.get(key).map(String::as_str),
            Some(value),
            "{key}: {healthy:#?}"
        );
    }

    // gpuctl health reads the same figures nvidia-smi printed.
    let run = sim.run(&["health", "--json"]);
    let doc: Value = serde_json::from_str(&run.stdout).expect("health JSON");
    for (index, q) in [(0, healthy), (1, sick)] {
        let r = &doc["gpus"][index]["readings"];
        let num = |key: &str| -> u64 { q[key].parse().unwrap_or_else(|_| panic!("{key}")) };
        let yes = |key: &str| q[key] == "Yes";
        let ecc = "ECC Errors";
        assert_eq!(
            r["ecc"]["volatile_corrected"],
            num(&format!("{ecc}/Volatile/DRAM Correctable"))
        );
        assert_eq!(
            r["ecc"]["volatile_uncorrected"],
            num(&format!("{ecc}/Volatile/DRAM Uncorrectable"))
        );
        assert_eq!(
            r["ecc"]["aggregate_corrected"],
            num(&format!("{ecc}/Aggregate/DRAM Correctable"))
        );
        assert_eq!(
            r["ecc"]["aggregate_uncorrected"],
            num(&format!("{ecc}/Aggregate/DRAM Uncorrectable"))
        );
        let rows = &r["remapped_rows"];
        assert_eq!(rows["correctable"], num("Remapped Rows/Correctable Error"));
        assert_eq!(
            rows["uncorrectable"],
            num("Remapped Rows/Uncorrectable Error")
        );
        assert_eq!(rows["pending"], yes("Remapped Rows/Pending"));
        assert_eq!(
            rows["failure"],
            yes("Remapped Rows/Remapping Failure Occurred")
        );
        match q["Retired Pages/Pending Page Blacklist"].as_str() {
            "N/A" => assert!(r["retired_pages"].is_null(), "{r}"),
            pending => {
                let pages = &r["retired_pages"];
                assert_eq!(pages["pending"], pending == "Yes");
                assert_eq!(pages["single_bit"], num("Retired Pages/Single Bit ECC"));
                assert_eq!(pages["double_bit"], num("Retired Pages/Double Bit ECC"));
            }
        }
        let reasons: Vec<&str> = r["clock_event_reasons"]
            .as_array()
            .expect("clock event reasons")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for (smi_name, ours) in [
            ("Idle", "gpu_idle"),
            ("HW Slowdown", "hw_slowdown"),
            ("SW Thermal Slowdown", "sw_thermal_slowdown"),
            ("HW Thermal Slowdown", "hw_thermal_slowdown"),
            ("SW Power Cap", "sw_power_cap"),
        ] {
            let active = q[&format!("Clocks Event Reasons/{smi_name}")] == "Active";
            assert_eq!(active, reasons.contains(&ours), "{smi_name}: {reasons:?}");
        }
    }
}

/// Under MPS nvidia-smi lists the server as `C` and each client, in the compute and MPS
/// lists both, as `M+C`, each with its own memory, as on a real Volta-or-later GPU; a
/// graphics process on the GPU without MPS stays `G` (the private table's slot 214 is the
/// MPS list, 215 the graphics list: the other way round, the clients read `C+G`).
#[test]
fn nvidia_smi_lists_an_mps_server_as_c_and_its_clients_as_m_plus_c() {
    let server = Proc::spawn_ready("sleep", "nvidia-cuda-mps-server", &[]);
    let rank0 = Proc::spawn_ready("sleep", "python3", &["rank0.py"]);
    let rank1 = Proc::spawn_ready("sleep", "python3", &["rank1.py"]);
    let display = Proc::spawn_ready("sleep", "Xorg", &[]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .gpu(Gpu::new())
            .process(Process::new(server.pid()).used(GIB).mps_server())
            .process(Process::new(rank0.pid()).used(8 * GIB).mps_client())
            .process(Process::new(rank1.pid()).used(4 * GIB).mps_client())
            .process(Process::new(display.pid()).on(1).used(GIB).graphics()),
    );
    let text = smi(&sim, &[]);
    let row = |pid: u32| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no row for pid {pid}:\n{text}"));
        line.trim_matches(|c| c == '|' || c == ' ')
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let (server_row, rank0_row, rank1_row) =
        (row(server.pid()), row(rank0.pid()), row(rank1.pid()));
    assert_eq!(server_row[4], "C", "{server_row:?}");
    assert_eq!(server_row[5], "nvidia-cuda-mps-server", "{server_row:?}");
    assert_eq!(server_row.last().unwrap(), "1024MiB");
    assert_eq!(rank0_row[4], "M+C", "{rank0_row:?}");
    assert_eq!(rank0_row.last().unwrap(), "8192MiB");
    assert_eq!(rank1_row[4], "M+C", "{rank1_row:?}");
    assert_eq!(row(display.pid())[4], "G");
    let apps = smi(
        &sim,
        &[
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ],
    );
    let mut apps: Vec<&str> = apps.lines().collect();
    apps.sort();
    let mut want = vec![
        format!("{}, 1024", server.pid()),
        format!("{}, 8192", rank0.pid()),
        format!("{}, 4096", rank1.pid()),
    ];
    want.sort();
    assert_eq!(apps, want);
}

/// `nvidia-smi -q`'s GPU Reset Status rows on the sim are a real H100/H200's: a GPU whose
/// scenario sets no health key shows "No" and "No", as the dumps of drivers 545 to 560 do;
/// the driver's recovery action sets them; only a driver without the field (the scenario's
/// `not_supported`, or a version before R550) shows N/A. gpuctl reads the same field.
#[test]
fn nvidia_smi_shows_the_reset_status_rows_as_a_real_h200_does() {
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .gpu(Gpu::new().recovery_action("gpu_reset"))
            .gpu(Gpu::new().recovery_action("drain_and_reset"))
            .gpu(Gpu::new().no_recovery_field()),
    );
    let q = parse_q(&smi(&sim, &["-q"]));
    let rows: Vec<(&str, &str)> = q
        .gpus
        .values()
        .map(|gpu| {
            (
                gpu["GPU Reset Status/Reset Required"].as_str(),
                gpu["GPU Reset Status/Drain and Reset Recommended"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [("No", "No"), ("Yes", "No"), ("Yes", "Yes"), ("N/A", "N/A")]
    );
    let run = sim.run(&["health", "--json"]);
    let doc: Value = serde_json::from_str(&run.stdout).expect("health JSON");
    let read: Vec<&Value> = (0..4)
        .map(|i| &doc["gpus"][i]["readings"]["recovery_action"])
        .collect();
    assert_eq!(
        read,
        [
            &serde_json::json!("none"),
            &serde_json::json!("gpu_reset"),
            &serde_json::json!("drain_and_reset"),
            &Value::Null
        ]
    );

    let old = Sim::new(&Scenario::new().driver_version("535.183.01").gpu(Gpu::new()));
    let q = parse_q(&smi(&old, &["-q"]));
    let gpu = q.gpus.values().next().expect("one GPU");
    assert_eq!(gpu["GPU Reset Status/Reset Required"], "N/A");
}
