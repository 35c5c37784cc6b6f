//! Property tests of the scenario parser: any text is a scenario or a one-line error naming
//! the file, never a panic (the sim runs inside its clients: a panic there is theirs).
//! Longer runs: `PROPTEST_CASES=100000 cargo test -p nvml-sim --test fuzz`.

use std::path::Path;

use proptest::prelude::*;

fn tricky_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("[[gpu]]\n".to_string()),
            Just("[[process]]\n".to_string()),
            Just("pid = ".to_string()),
            Just("gpu = ".to_string()),
            Just("used_mib = ".to_string()),
            Just("memory_total_mib = ".to_string()),
            Just("uuid = ".to_string()),
            Just("pci_bus_id = ".to_string()),
            Just("\n".to_string()),
            Just("\"".to_string()),
            Just("-".to_string()),
            "[0-9]{1,22}",
            "[a-zA-Z_:.]{1,12}",
            any::<char>().prop_map(String::from),
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn scenarios_never_panic(text in tricky_text()) {
        if let Err(error) = nvml_sim::scenario::parse(Path::new("scenario.toml"), &text) {
            let message = error.to_string();
            prop_assert!(message.contains("scenario.toml"), "{}", message);
        }
    }

    #[test]
    fn bus_ids_and_uuids_never_panic(text in "[0-9a-fA-FxX:.-]{0,24}") {
        let _ = nvml_sim::scenario::PciBusId::parse(&text);
    }
}
