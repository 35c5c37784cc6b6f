//! The `--json` documents against their published JSON Schemas (docs/schema/). The schemas
//! require every field and forbid unknown ones, so a field added, renamed or dropped without
//! a schema change fails here. Each document goes through two validators: `validate` below
//! (a subset, with short messages these tests match on) and `conforms`, a complete JSON
//! Schema 2020-12 validator (the jsonschema crate), which also holds the schemas themselves
//! to the 2020-12 meta-schema.

use std::os::unix::process::CommandExt;

use serde_json::{Map, Value};

use crate::util::{Gpu, MIB, Proc, Process, Scenario, Sim};

fn schema_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema")
}

pub use crate::util::schema;

/// `schema`, held to its meta-schema (2020-12, which `$schema` names), compiled by a complete
/// JSON Schema validator.
fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::meta::validate(schema).map_err(|e| {
        format!(
            "the schema is not valid JSON Schema: at '{}': {e}",
            e.instance_path()
        )
    })?;
    jsonschema::draft202012::new(schema).map_err(|e| format!("the schema does not compile: {e}"))
}

/// `doc` against `schema` with the complete validator. `Err` holds every violation, one a
/// line, in the validator's words with the JSON pointer of the offending value.
pub fn conforms(schema: &Value, doc: &Value) -> Result<(), String> {
    let errors: Vec<String> = compile(schema)?
        .iter_errors(doc)
        .map(|e| format!("at '{}': {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// Validates `value` against the subset of JSON Schema the published schemas use: type,
/// const, enum, properties, required, additionalProperties: false, items, oneOf, minimum and
/// local $ref. Returns the first violation with its JSON path.
pub fn validate(root: &Value, schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let schema = resolve(root, schema);
    if let Some(types) = schema.get("type") {
        let allowed: Vec<&str> = match types {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return Err(format!("{path}: bad type in schema")),
        };
        if !allowed.iter().any(|t| type_matches(t, value)) {
            return Err(format!("{path}: {value} is not of type {allowed:?}"));
        }
    }
    if let Some(expected) = schema.get("const")
        && expected != value
    {
        return Err(format!("{path}: {value} is not {expected}"));
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.contains(value)
    {
        return Err(format!("{path}: {value} is not one of {options:?}"));
    }
    if let (Some(min), Some(n)) = (
        schema.get("minimum").and_then(Value::as_f64),
        value.as_f64(),
    ) && n < min
    {
        return Err(format!("{path}: {n} is below {min}"));
    }
    if let Some(Value::Array(options)) = schema.get("oneOf") {
        let matching = options
            .iter()
            .filter(|option| validate(root, option, value, path).is_ok())
            .count();
        if matching != 1 {
            return Err(format!(
                "{path}: {value} matches {matching} of oneOf, not 1"
            ));
        }
    }
    if let Value::Object(object) = value {
        check_object(root, schema, object, path)?;
    }
    if let (Value::Array(items), Some(item_schema)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            validate(root, item_schema, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn check_object(
    root: &Value,
    schema: &Value,
    object: &Map<String, Value>,
    path: &str,
) -> Result<(), String> {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    if let Some(Value::Array(required)) = schema.get("required") {
        for key in required.iter().filter_map(Value::as_str) {
            if !object.contains_key(key) {
                return Err(format!("{path}: missing field '{key}'"));
            }
        }
    }
    for (key, field) in object {
        match properties.get(key) {
            Some(field_schema) => validate(root, field_schema, field, &format!("{path}.{key}"))?,
            None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                return Err(format!("{path}: unknown field '{key}'"));
            }
            None => {}
        }
    }
    Ok(())
}

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference.strip_prefix('#').expect("local $ref only");
            resolve(root, root.pointer(pointer).expect("$ref target exists"))
        }
        None => schema,
    }
}

fn type_matches(name: &str, value: &Value) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_u64() || value.is_i64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => false,
    }
}

#[test]
fn info_json_matches_its_schema_in_every_shape() {
    let healthy = Proc::sleeper("python3", &["train.py"]);
    let leader = Proc::spawn("zombie-leader", "python3", &["worker.py"]);
    leader.wait_for_state('Z');
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new().leaked(100 * MIB))
            .gpu(Gpu::new().lost())
            .gpu(Gpu::new().unsupported(&["temperature", "power", "utilization"]))
            .process(
                Process::new(healthy.pid())
                    .on_each(&[0, 2])
                    .used(500 * MIB)
                    .sm(40),
            )
            // No used_mib: NVML reports the process's memory as unavailable.
            .process(Process::new(leader.pid())),
    );
    let run = sim.run(&["info", "--json"]);
    assert_eq!(run.code, 1, "one GPU is lost: {}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let schema = schema("info-v1.schema.json");
    validate(&schema, &schema, &doc, "$").unwrap();
    conforms(&schema, &doc).unwrap_or_else(|e| panic!("{e}"));

    // The shapes the document was meant to exercise are really there.
    let devices = doc["devices"].as_array().unwrap();
    assert_eq!(devices[1]["status"], "lost");
    assert!(devices[2]["temperature_c"].is_null());
    assert!(
        devices[0]["memory"]["unattributed_bytes"].is_null(),
        "a size is not available"
    );
    assert_eq!(devices[0]["processes"].as_array().unwrap().len(), 2);

    // The totals of --by, under either key.
    for by in ["user", "owner"] {
        let run = sim.run(&["info", "--json", "--by", by]);
        let doc: Value = serde_json::from_str(&run.stdout).unwrap();
        validate(&schema, &schema, &doc, "$").unwrap();
        conforms(&schema, &doc).unwrap_or_else(|e| panic!("{e}"));
        assert!(doc["totals"][0][by].is_string(), "{by}: {}", doc["totals"]);
    }
}

#[test]
fn the_validator_rejects_unknown_and_missing_fields() {
    let schema = schema("info-v1.schema.json");
    let sim = Sim::new("driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n");
    let doc = sim.json(&["info"]);
    validate(&schema, &schema, &doc, "$").unwrap();
    conforms(&schema, &doc).unwrap_or_else(|e| panic!("{e}"));

    let mut extra = doc.clone();
    extra["devices"][0]["surprise"] = Value::Bool(true);
    let error = validate(&schema, &schema, &extra, "$").unwrap_err();
    assert!(error.contains("unknown field 'surprise'"), "{error}");
    let error = conforms(&schema, &extra).unwrap_err();
    assert!(
        error.contains("at '/devices/0'") && error.contains("'surprise'"),
        "{error}"
    );

    let mut missing = doc.clone();
    missing["devices"][0]["memory"]
        .as_object_mut()
        .unwrap()
        .remove("free_bytes");
    let error = validate(&schema, &schema, &missing, "$").unwrap_err();
    assert!(error.contains("missing field 'free_bytes'"), "{error}");
    let error = conforms(&schema, &missing).unwrap_err();
    assert!(
        error.contains("at '/devices/0/memory'") && error.contains("\"free_bytes\""),
        "{error}"
    );

    let mut wrong = doc;
    wrong["schema"] = Value::from(2);
    assert!(validate(&schema, &schema, &wrong, "$").is_err());
    let error = conforms(&schema, &wrong).unwrap_err();
    assert!(error.contains("at '/schema'"), "{error}");
}

#[test]
fn the_published_schemas_are_valid_json_schema() {
    let mut names: Vec<_> = std::fs::read_dir(schema_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".schema.json"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 10, "{names:?}");
    for name in names {
        let schema = schema(&name);
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{name}"
        );
        compile(&schema).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // The meta-schema check has teeth.
    let typo = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "strnig"
    });
    assert!(compile(&typo).is_err());
}

#[test]
fn kill_and_clear_json_match_their_schema() {
    // A crashed run's two workers: their group leader (a process of its own group) is killed.
    let mut leader = std::process::Command::new("sh")
        .args(["-c", "sleep 60 & first=$!; sleep 60 & echo $first $!; wait"])
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(leader.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let workers: Vec<u32> = line
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    let _ = leader.kill();
    let _ = leader.wait();
    let alone = Proc::sleeper("python3", &["eval.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .driver_version("1")
            .gpu(Gpu::new().leaked(512 * MIB))
            .processes(
                [workers[0], workers[1], alone.pid()].map(|pid| Process::new(pid).used(100 * MIB)),
            ),
    );
    let schema = schema("reclaim-v1.schema.json");
    for args in [
        vec!["clear", "--dry-run"],
        vec!["kill", "--pid", "1", "--dry-run"],
        vec!["kill", "--pid", &alone.pid().to_string(), "--timeout", "2s"],
        vec!["clear", "--timeout", "2s", "--wait=1s"],
    ] {
        let run = sim.run(&[args.as_slice(), &["--json"]].concat());
        let doc: Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}{}", run.stdout, run.stderr));
        validate(&schema, &schema, &doc, "$").unwrap_or_else(|e| panic!("{args:?}: {e}"));
        conforms(&schema, &doc).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
    // No cleanup by pid: the workers were reclaimed above, and a pid once freed may already
    // belong to someone else. A straggler ends by itself within a minute.
}

#[test]
fn reset_fraction_and_enable_json_match_their_schemas() {
    let sim = Sim::new(
        "driver_version = \"1\"\ncuda_driver_version = 12080\n\
         [[gpu]]\n[[gpu]]\nunsupported = [\"locked_clocks\"]\nno_permission = [\"compute_mode\", \"persistence_mode\"]\n",
    );
    std::fs::write(sim.config_path(), "[fraction]\ndefault = 0.5\n").unwrap();
    for (schema_file, args) in [
        ("reset-v1.schema.json", vec!["reset", "--dry-run"]),
        ("reset-v1.schema.json", vec!["reset"]),
        ("fraction-v1.schema.json", vec!["fraction"]),
        (
            "fraction-v1.schema.json",
            vec!["fraction", "--user", "nobody"],
        ),
        ("enable-v1.schema.json", vec!["enable"]),
        ("enable-v1.schema.json", vec!["enable", "--persistence"]),
        ("health-v1.schema.json", vec!["health"]),
    ] {
        let run = sim.run(&[args.as_slice(), &["--json"]].concat());
        let doc: Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}{}", run.stdout, run.stderr));
        let schema = schema(schema_file);
        validate(&schema, &schema, &doc, "$").unwrap_or_else(|e| panic!("{args:?}: {e}"));
        conforms(&schema, &doc).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
}

/// Every finding kind classify defines is one the reclaim schema allows, under its name.
#[test]
fn the_reclaim_schema_names_every_finding_kind() {
    let schema = schema("reclaim-v1.schema.json");
    let listed: Vec<&str> = schema["$defs"]["finding"]["properties"]["kind"]["enum"]
        .as_array()
        .expect("finding.kind is an enum")
        .iter()
        .map(|kind| kind.as_str().unwrap())
        .collect();
    let defined: Vec<&str> = gpuctl_core::classify::Kind::ALL
        .iter()
        .map(|kind| kind.name())
        .collect();
    assert_eq!(listed, defined);
    for kind in gpuctl_core::classify::Kind::ALL {
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
    }
}

/// The typed fields of the health and findings documents read and write exactly the strings
/// the schemas name: each history, each owner form (the job's cgroup, a uid's environment
/// claim, the others), each finding kind; a document round-trips through the types
/// unchanged and conforms.
#[test]
fn typed_histories_owners_and_kinds_round_trip_as_the_schemas_say() {
    use gpuctl_core::health::{Cause, History};
    use gpuctl_core::report::WatchdogFinding;
    let health = schema("health-v1.schema.json");
    let names = |enum_of: &Value| -> Vec<String> {
        let mut names: Vec<String> = enum_of["enum"]
            .as_array()
            .expect("an enum")
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    let mut histories: Vec<String> = History::ALL
        .iter()
        .map(|h| {
            serde_json::to_value(h)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    histories.sort();
    assert_eq!(
        histories,
        names(&health["$defs"]["cause"]["properties"]["history"])
    );
    let cause_def = &health["$defs"]["cause"];
    let of_def = |name: &str| serde_json::json!({ "$defs": health["$defs"].clone(), "$ref": format!("#/$defs/{name}") });
    for history in ["recovery_action", "acknowledged", "reset", "catalog"] {
        let doc = serde_json::json!({
            "kind": "xid", "action": "none", "message": "Xid 13", "xid": 13,
            "history": history,
            "processes": [
                { "pid": 1, "owner": "slurm:812" },
                { "pid": 2, "owner": "slurm:812@1000", "user": "alice" },
                { "pid": 3, "owner": "unit:vllm.service", "command": "vllm" },
                { "pid": 4, "owner": "pod:1a2b3c4d-0000-4000-8000-00000000abcd" },
                { "pid": 5 }
            ]
        });
        let cause: Cause = serde_json::from_value(doc.clone()).unwrap();
        let back = serde_json::to_value(&cause).unwrap();
        assert_eq!(back, doc);
        validate(&health, cause_def, &back, "$").unwrap_or_else(|e| panic!("{e}"));
        conforms(&of_def("cause"), &back).unwrap_or_else(|e| panic!("{e}"));
    }
    for bad in ["slurm:812@alice", "slurm:x", "812"] {
        let process = serde_json::json!({ "pid": 1, "owner": bad });
        assert!(conforms(&of_def("xid_process"), &process).is_err(), "{bad}");
    }

    let info = schema("info-v1.schema.json");
    let kind_def = &info["properties"]["watchdog"]["properties"]["findings"]["items"];
    let mut kinds: Vec<String> = gpuctl_core::classify::Kind::ALL
        .iter()
        .map(|k| k.name().to_string())
        .collect();
    kinds.sort();
    assert_eq!(kinds, names(&kind_def["properties"]["kind"]));
    for kind in gpuctl_core::classify::Kind::ALL {
        let doc = serde_json::json!({
            "kind": kind.name(), "gpus": [0], "uuids": ["GPU-0"], "pid": 7,
            "since_unix": 1.5, "reason": "why"
        });
        let finding: WatchdogFinding = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(finding.kind, kind);
        assert_eq!(serde_json::to_value(&finding).unwrap(), doc);
        validate(&info, kind_def, &doc, "$").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A stand-in for Prometheus' query API on a loopback port: each request is answered with
/// the body `answer` gives for its query (form-encoded POST), until the test ends. The real
/// Prometheus is tests/prometheus_real's; this one lets every document be held to its schema
/// here, with fixed figures.
fn canned_prometheus(answer: fn(&str) -> String) -> u16 {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let body = answer(&String::from_utf8_lossy(&body));
            let _ = (&stream).write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    port
}

/// One instant vector of `(labels, value)`.
fn vector(samples: &[(&[(&str, &str)], f64)]) -> String {
    let result: Vec<Value> = samples
        .iter()
        .map(|(labels, value)| {
            let metric: Map<String, Value> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), Value::from(*v)))
                .collect();
            serde_json::json!({ "metric": metric, "value": [1.0, value.to_string()] })
        })
        .collect();
    serde_json::json!({ "status": "success", "data": { "resultType": "vector", "result": result } })
        .to_string()
}

fn fleet_answer(form: &str) -> String {
    if form.contains("gpuctl_user_memory_bytes") {
        return vector(&[
            (&[("user", "alice"), ("q", "held")], 4e9),
            (&[("user", "alice"), ("q", "held_over")], 7.2e13),
        ]);
    }
    let n = |q: &'static str| -> [(&'static str, &'static str); 2] {
        [("instance", "gpu-01:9100"), ("q", q)]
    };
    vector(&[
        (&n("known"), 5.0),
        (&n("up"), 1.0),
        (&n("age"), 2.0),
        (&n("nvml_up"), 1.0),
        (&n("gpus"), 8.0),
        (&n("used"), 6e9),
        (&n("total"), 1.1e12),
        (
            &[
                ("instance", "gpu-01:9100"),
                ("q", "held"),
                ("kind", "orphaned"),
                ("owner", "slurm:7"),
            ],
            3e9,
        ),
        (
            &[
                ("instance", "gpu-01:9100"),
                ("q", "findings"),
                ("kind", "orphaned"),
            ],
            2.0,
        ),
        (
            &[
                ("instance", "gpu-01:9100"),
                ("q", "health"),
                ("gpu", "3"),
                ("action", "gpu_reset"),
            ],
            1.0,
        ),
        (&[("instance", "gpu-02:9100"), ("q", "known")], 5.0),
        (&[("instance", "gpu-02:9100"), ("q", "up")], 0.0),
    ])
}

#[test]
fn fleet_json_matches_its_schema() {
    let port = canned_prometheus(fleet_answer);
    let url = format!("http://127.0.0.1:{port}");
    let sim = Sim::new("");
    let schema = schema("fleet-v1.schema.json");
    for args in [
        vec!["fleet"],
        vec!["fleet", "--by", "user", "--since", "7d"],
        vec!["fleet", "--plan"],
    ] {
        let run = sim.run(&[args.as_slice(), &["--prometheus", &url, "--json"]].concat());
        let doc: Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}{}", run.stdout, run.stderr));
        validate(&schema, &schema, &doc, "$").unwrap_or_else(|e| panic!("{args:?}: {e}"));
        conforms(&schema, &doc).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
    let doc = sim.json(&["fleet", "--prometheus", &url]);
    assert_eq!(doc["nodes"][0]["node"], "gpu-01", "{doc:#}");
    assert_eq!(doc["nodes"][0]["clearable_bytes"], 3_000_000_000u64);
    assert_eq!(doc["nodes"][1]["status"], "target_down");
}
