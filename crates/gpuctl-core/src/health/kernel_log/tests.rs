use std::io::Write;

use super::*;

#[test]
fn the_drivers_xid_lines_give_the_bus_the_xid_and_the_process() {
    let line = parse_message(
        "NVRM: Xid (PCI:0000:18:00): 13, pid=8202, name=python3, Graphics Exception: ESR 0x1",
    )
    .unwrap();
    assert_eq!(line.address, PciAddress::parse("00000000:18:00.0").unwrap());
    assert_eq!((line.xid, line.pid), (13, Some(8202)));
    assert_eq!(line.name.as_deref(), Some("python3"));
    // Older drivers: no name; GPU-level Xids: no process.
    let line =
        parse_message("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row").unwrap();
    assert_eq!((line.xid, line.pid, line.name), (63, Some(1896), None));
    let line = parse_message(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    )
    .unwrap();
    assert_eq!((line.xid, line.pid, line.name), (79, None, None));
    assert_eq!(line.address.bus, 0x3b);
    for not_xid in [
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
        "NVRM: Xid (PCI:zz:00): 13, pid=1",
        "NVRM: Xid (PCI:0000:18:00): x, pid=1",
        "usb 1-1: new device",
    ] {
        assert_eq!(parse_message(not_xid), None, "{not_xid}");
    }
}

#[test]
fn kmsg_records_give_their_sequence_number_and_message() {
    assert_eq!(
        parse_record("4,350,3475426945,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1"),
        Some((350, "NVRM: Xid (PCI:0000:18:00): 13, pid=1"))
    );
    assert_eq!(parse_record(" SUBSYSTEM=pci"), None);
    assert_eq!(parse_record("4,x,1,-;text"), None);
}

fn record(seq: u64, message: &str) -> String {
    format!("4,{seq},{},-;{message}\n", seq * 1000)
}

#[test]
fn the_reader_starts_at_the_end_goes_on_from_its_place_and_claims_each_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kmsg");
    let bus = PciAddress::parse("0000:18:00").unwrap();
    let line = |pid: u32| format!("NVRM: Xid (PCI:0000:18:00): 13, pid={pid}, name=python3, x");
    std::fs::write(&path, record(1, &line(100))).unwrap();
    let mut log = KernelLog::open(&path, None).unwrap();
    log.read_new();
    assert_eq!(
        log.take(bus, 13),
        None,
        "a line from before the start is old"
    );
    let append = |text: String| {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(text.as_bytes()).unwrap();
    };
    append(
        record(2, &line(200)) + &record(3, "NVRM: Xid (PCI:0000:2a:00): 13, pid=300, name=a, x"),
    );
    log.read_new();
    assert_eq!(log.take(bus, 31), None);
    assert_eq!(log.take(bus, 13).unwrap().pid, Some(200));
    assert_eq!(log.take(bus, 13), None, "claimed once");
    let place = log.place().unwrap();
    assert_eq!(place.seq, 3);
    place.write(dir.path()).unwrap();

    // A restart goes on from its place: line 2 is not read again, and line 4, written
    // while no reader ran, is read past (its event went with the old reader); line 5 is new.
    append(record(4, &line(400)));
    let place = Place::read(dir.path()).unwrap();
    let mut log = KernelLog::open(&path, Some(&place)).unwrap();
    assert_eq!(log.place().unwrap().seq, 4);
    append(record(5, &line(500)));
    log.read_new();
    assert_eq!(log.take(bus, 13).unwrap().pid, Some(500));
    assert_eq!(log.take(bus, 13), None);
    // Another boot's place is no place: the end.
    let other_boot = Place {
        boot_id: "another".into(),
        seq: 0,
    };
    let mut log = KernelLog::open(&path, Some(&other_boot)).unwrap();
    log.read_new();
    assert_eq!(log.take(bus, 13), None);
}

#[test]
fn an_xid_names_the_process_the_kernel_named_and_never_guesses() {
    let on_gpu = |pids: &[u32]| -> Vec<crate::health::XidProcess> {
        pids.iter()
            .map(|&pid| crate::health::XidProcess {
                pid,
                user: Some("alice".into()),
                ..Default::default()
            })
            .collect()
    };
    let pids = |ps: Vec<crate::health::XidProcess>| ps.iter().map(|p| p.pid).collect::<Vec<_>>();
    let line = |pid: Option<u32>| KernelXid {
        address: PciAddress::parse("0000:18:00").unwrap(),
        xid: 13,
        pid,
        name: Some("python3".into()),
    };
    let named = culprits(on_gpu(&[10, 20]), Some(&line(Some(20))), true);
    assert_eq!(pids(named.clone()), [20]);
    assert_eq!(named[0].user.as_deref(), Some("alice"));
    // Gone from the GPU already: as the line names it.
    let gone = culprits(on_gpu(&[10]), Some(&line(Some(30))), true);
    assert_eq!(
        (gone[0].pid, gone[0].command.as_deref()),
        (30, Some("python3"))
    );
    // No line, or one without a process: nobody for an application Xid, every tenant for
    // a GPU-level one.
    assert!(culprits(on_gpu(&[10, 20]), None, true).is_empty());
    assert!(culprits(on_gpu(&[10, 20]), Some(&line(None)), true).is_empty());
    assert_eq!(pids(culprits(on_gpu(&[10, 20]), None, false)), [10, 20]);
    assert_eq!(
        pids(culprits(on_gpu(&[10, 20]), Some(&line(Some(10))), false)),
        [10]
    );
}
