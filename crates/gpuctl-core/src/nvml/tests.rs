use super::*;

#[test]
fn the_timeout_comes_from_the_flag_then_the_environment_then_the_file() {
    let s = Duration::from_secs;
    assert_eq!(
        timeout_from(Some(s(1)), Some("2s"), Some(s(3))).unwrap(),
        s(1)
    );
    assert_eq!(timeout_from(None, Some("2s"), Some(s(3))).unwrap(), s(2));
    assert_eq!(timeout_from(None, Some(" "), Some(s(3))).unwrap(), s(3));
    assert_eq!(timeout_from(None, None, None).unwrap(), DEFAULT_TIMEOUT);
    for bad in ["soon", "0", "-1s"] {
        let error = timeout_from(None, Some(bad), None).unwrap_err().to_string();
        assert!(error.starts_with("GPUCTL_NVML_TIMEOUT="), "{error}");
    }
}

fn uuids() -> Vec<Option<String>> {
    vec![
        Some("GPU-0b6c1d2e-aaaa-bbbb-cccc-000000000000".into()),
        Some("GPU-0b6c9999-aaaa-bbbb-cccc-000000000001".into()),
        None,
    ]
}

fn buses() -> Vec<Option<String>> {
    vec![
        Some("00000000:18:00.0".into()),
        Some("00000000:2A:00.0".into()),
        None,
    ]
}

fn resolve(selectors: &[&str]) -> Result<Vec<u32>> {
    let selectors: Vec<String> = selectors.iter().map(|s| s.to_string()).collect();
    resolve_selectors(&selectors, &uuids(), &buses())
}

#[test]
fn selects_by_index_uuid_prefix_and_bus() {
    assert_eq!(resolve(&[]).unwrap(), vec![0, 1, 2]);
    assert_eq!(resolve(&["2", "0", "0"]).unwrap(), vec![0, 2]);
    assert_eq!(
        resolve(&["GPU-0b6c1d2e-aaaa-bbbb-cccc-000000000000"]).unwrap(),
        vec![0]
    );
    assert_eq!(resolve(&["gpu-0B6C99"]).unwrap(), vec![1]);
    assert_eq!(resolve(&["0b6c1d"]).unwrap(), vec![0]);
    assert_eq!(resolve(&["0000:2a:00.0"]).unwrap(), vec![1]);
}

#[test]
fn bad_selectors_name_what_exists() {
    let message = resolve(&["7"]).unwrap_err().to_string();
    assert!(message.contains("no GPU matches '7'"), "{message}");
    assert!(message.contains("0 (GPU-0b6c1d2e"), "{message}");
    assert!(message.contains("2 (unavailable)"), "{message}");
    let ambiguous = resolve(&["GPU-0b6c"]).unwrap_err().to_string();
    assert!(
        ambiguous.contains("matches several GPUs (0, 1)"),
        "{ambiguous}"
    );
    // Too short to stand for a UUID, and not a number.
    assert!(resolve(&["0b"]).is_err());
    assert!(resolve(&["-1"]).is_err());
}

fn strings(selectors: &[&str]) -> Vec<String> {
    selectors.iter().map(|s| s.to_string()).collect()
}

/// [`places_from`] with the test tables, counting their reads, and MIG instances 0/9 and
/// `MIG-AAAA` known.
fn places(selectors: &[&str]) -> (Result<Vec<Place>>, usize) {
    let reads = std::cell::Cell::new(0);
    let tables = || {
        reads.set(reads.get() + 1);
        Ok(GpuTables {
            uuids: uuids(),
            buses: buses(),
        })
    };
    let mig = |name: MigName<'_>| match name {
        MigName::Ids(0, 9) => Ok(Place {
            gpu: 0,
            gpu_instance: Some(9),
        }),
        MigName::Uuid("MIG-AAAA") => Ok(Place {
            gpu: 1,
            gpu_instance: Some(3),
        }),
        other => Err(CoreError::GpuSelector(format!("no {other:?}"))),
    };
    let found = places_from(&strings(selectors), tables, mig);
    (found, reads.get())
}

#[test]
fn places_read_the_uuid_and_bus_tables_once_for_any_number_of_gpus() {
    let (found, reads) = places(&["2", "GPU-0b6c1d2e", "0000:2a:00.0", "0", "0/9"]);
    assert_eq!(
        reads, 1,
        "one read of the tables for four whole-GPU selectors"
    );
    let mig = Place {
        gpu: 0,
        gpu_instance: Some(9),
    };
    assert_eq!(
        found.unwrap(),
        vec![Place::whole(2), Place::whole(0), Place::whole(1), mig],
        "in the order named, each once"
    );
    // Instances only: no table is read.
    let (found, reads) = places(&["0/9", "MIG-AAAA", "0/9"]);
    assert_eq!(reads, 0);
    assert_eq!(found.unwrap().len(), 2);
    let (found, reads) = places(&[]);
    assert_eq!((found.unwrap(), reads), (Vec::new(), 0));
}

#[test]
fn places_refuse_the_first_bad_selector_as_resolve_does() {
    let (found, _) = places(&["0", "7", "0/x"]);
    let message = found.unwrap_err().to_string();
    assert!(message.contains("no GPU matches '7'"), "{message}");
    assert_eq!(
        places(&["0/x"]).0.unwrap_err().to_string(),
        places(&["0/x", "7"]).0.unwrap_err().to_string()
    );
    assert!(
        places(&["0/x"])
            .0
            .unwrap_err()
            .to_string()
            .contains("is not a MIG instance: give GPU/GI")
    );
    let (found, reads) = places(&["0/5"]);
    assert!(found.is_err() && reads == 0);
}

#[test]
fn no_gpus_says_so() {
    let message = resolve_selectors(&["0".into()], &[], &[])
        .unwrap_err()
        .to_string();
    assert!(message.contains("this machine has no GPUs"), "{message}");
}

#[test]
fn a_place_is_written_as_a_selector_names_it() {
    assert_eq!(Place::whole(3).to_string(), "3");
    let instance = Place {
        gpu: 3,
        gpu_instance: Some(9),
    };
    assert_eq!(instance.to_string(), "3/9");
}
