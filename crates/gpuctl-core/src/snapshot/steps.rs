//! The steps of [`Snapshot::take_from`]: NVML's listings read, localised through the host
//! service where one answers from inside a container, joined with each process's host facts,
//! and the device files scanned for holders.

use super::*;

/// Read: every selected GPU's figures, and the processes each lists.
pub(super) fn read_listings(
    gpus: &Gpus,
    options: &SnapshotOptions,
) -> Result<(Vec<GpuSnapshot>, Vec<Listing>)> {
    let indices = match &options.gpus {
        Some(indices) => indices.clone(),
        None => (0..gpus.count()?).collect(),
    };
    let since_us = options.utilization_window.map(|window| {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        now.saturating_sub(window).as_micros() as u64
    });
    Ok(read_gpus(
        gpus,
        &indices,
        since_us,
        Fields::of(options),
        options.health,
    )
    .into_iter()
    .unzip())
}

/// Localise: in a PID namespace of its own, NVML's host PIDs mean nothing here; the host
/// service, where asking is allowed and one answers, names this namespace's processes on
/// each GPU. How it was asked, and what its answer changed.
pub(super) fn ask_host_service(
    devices: &mut [GpuSnapshot],
    listed: &mut [Listing],
) -> (
    Option<crate::service::client::ServiceUse>,
    Option<Localized>,
) {
    if !crate::service::client::asking_allowed() {
        return (None, None);
    }
    let (used, reply) = crate::service::client::ask_for_snapshot();
    (
        Some(used),
        reply.map(|reply| localize(devices, listed, &reply)),
    )
}

/// Each pid once, in listing order (a process is listed by every GPU it is on).
pub(super) fn distinct_pids<'a>(listings: impl IntoIterator<Item = &'a Listing>) -> Vec<u32> {
    let listings: Vec<&Listing> = listings.into_iter().collect();
    // At least the longest list's many: sized once, not grown pid by pid.
    let most = listings
        .iter()
        .map(|l| l.processes.len())
        .max()
        .unwrap_or(0);
    let mut seen = PidSet::with_capacity_and_hasher(most, Default::default());
    let mut pids = Vec::with_capacity(most);
    for pid in listings.iter().flat_map(|l| &l.processes).map(|p| p.pid) {
        if seen.insert(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Join: each listed process gets its host facts (shared by its entries on every GPU), from
/// the fact cache where a long-running reader keeps one. Where the host service answered,
/// its GPUs' pids are this namespace's and the others' the host's: read apart, as one
/// number may stand for two processes.
pub(super) fn join_facts(
    devices: &mut [GpuSnapshot],
    listed: Vec<Listing>,
    view: &ProcView,
    localized: Option<&Localized>,
    cache: Option<&mut FactCache>,
) {
    match (localized, cache) {
        (Some(localized), _) => {
            let answered = |position: usize| localized.answered[position];
            let local_pids = distinct_pids(
                listed
                    .iter()
                    .enumerate()
                    .filter_map(|(i, l)| answered(i).then_some(l)),
            );
            let other_pids = distinct_pids(
                listed
                    .iter()
                    .enumerate()
                    .filter_map(|(i, l)| (!answered(i)).then_some(l)),
            );
            let local = localized.confirm(view.as_local().processes(&local_pids));
            let other = arc_facts(view.processes(&other_pids));
            join(devices, listed, view, &|position, pid| {
                match answered(position) {
                    true => local.get(&pid),
                    false => other.get(&pid),
                }
                .cloned()
            });
        }
        (None, Some(cache)) => {
            let facts = view.processes_cached(&distinct_pids(&listed), cache);
            join(devices, listed, view, &|_, pid| facts.get(pid).cloned());
        }
        (None, None) => {
            let facts = arc_facts(view.processes(&distinct_pids(&listed)));
            join(devices, listed, view, &|_, pid| facts.get(&pid).cloned());
        }
    }
}

/// Fills each GPU's processes from its listing, each with the facts `fact_of` gives (by the
/// GPU's position and the pid); one placeholder stands for any that could not be read.
pub(super) fn join(
    devices: &mut [GpuSnapshot],
    listed: Vec<Listing>,
    view: &ProcView,
    fact_of: &dyn Fn(usize, u32) -> Option<Arc<HostProcess>>,
) {
    let unread = Arc::new(HostProcess::unconfirmed("not read"));
    for (position, (gpu, listing)) in devices.iter_mut().zip(listed).enumerate() {
        // Per GPU: each list was read at its own moment (a slow GPU's much later).
        let listed_at = listing.at.and_then(|at| view.boot_ticks(at));
        gpu.processes = listing
            .processes
            .into_iter()
            .map(|p| {
                let host = as_listed(
                    p.pid,
                    fact_of(position, p.pid).unwrap_or_else(|| Arc::clone(&unread)),
                    listed_at,
                );
                GpuProcess {
                    pid: p.pid,
                    used_bytes: p.used_bytes,
                    kind: p.kind,
                    sm_util_pct: p.sm_util_pct,
                    idle: None,
                    reclaimable: None,
                    gpu_instance_id: p.gpu_instance_id,
                    compute_instance_id: p.compute_instance_id,
                    mps: crate::mps::Role::of(
                        p.mps_client,
                        host.comm.as_deref(),
                        host.argv0_name(),
                    ),
                    host,
                }
            })
            .collect();
        gpu.fill_mig_processes();
    }
}

/// Scan: the device-file holders NVML does not list, and how long finding them took.
pub(super) fn scan_holders(
    gpus: &Gpus,
    devices: &mut [GpuSnapshot],
    view: &ProcView,
    scan: &HolderScan,
) -> Result<Duration> {
    let scanning = Instant::now();
    // A reader of memory and processes only (the watchdog) skipped the minor numbers,
    // which the scan matches device files by: read them now, through the GPUs' workers (a
    // hung GPU answers None and is not scanned).
    let unknown: Vec<u32> = devices
        .iter()
        .filter(|g| g.minor.is_none() && g.status == GpuStatus::Ok)
        .map(|g| g.index)
        .collect();
    if !unknown.is_empty() {
        let minors = gpus.on_each(&unknown, |nvml, index| {
            nvml.device_by_index(index).ok()?.minor_number().ok()
        });
        for (index, minor) in unknown.into_iter().zip(minors) {
            if let Some(gpu) = devices.iter_mut().find(|g| g.index == index) {
                gpu.minor = minor.flatten();
            }
        }
    }
    find_holders(devices, view, &scan.dev_dir)?;
    Ok(scanning.elapsed())
}

pub(super) fn arc_facts(facts: HashMap<u32, HostProcess>) -> HashMap<u32, Arc<HostProcess>> {
    facts
        .into_iter()
        .map(|(pid, fact)| (pid, Arc::new(fact)))
        .collect()
}

/// What the host service's answer changed in a snapshot's listings: which GPUs (by
/// position) it answered for, and the start time it gave each of their processes.
pub(super) struct Localized {
    answered: Vec<bool>,
    start_ticks: HashMap<u32, u64>,
}

impl Localized {
    /// Facts read locally for the service's pids, confirmed where the process there is
    /// the one the service named (same start time); any other is not attributed.
    pub(super) fn confirm(
        &self,
        facts: HashMap<u32, HostProcess>,
    ) -> HashMap<u32, Arc<HostProcess>> {
        facts
            .into_iter()
            .map(|(pid, mut fact)| {
                let expected = self.start_ticks.get(&pid).copied();
                if fact.confirmed && fact.start_ticks.is_some() && fact.start_ticks == expected {
                    fact.confirmed_by = Some("host service");
                } else if fact.confirmed {
                    fact = HostProcess::unconfirmed(format!(
                        "pid {pid} here is not the process the host service named (it \
                         exited and its pid was reused)"
                    ));
                }
                (pid, Arc::new(fact))
            })
            .collect()
    }
}

/// Replaces the listings of the GPUs `reply` answers for (by UUID) with the processes it
/// names, numbered as this namespace numbers them, and sets those GPUs' outside memory.
pub(super) fn localize(
    devices: &mut [GpuSnapshot],
    listed: &mut [Listing],
    reply: &crate::service::Reply,
) -> Localized {
    let mut start_ticks = HashMap::new();
    let answered = devices
        .iter_mut()
        .zip(listed.iter_mut())
        .map(|(gpu, listing)| {
            let Some(answer) = reply
                .gpus
                .iter()
                .find(|a| gpu.uuid.as_deref() == Some(a.uuid.as_str()))
            else {
                return false;
            };
            gpu.outside_namespace_bytes = Some(answer.outside_bytes);
            listing.processes = answer
                .processes
                .iter()
                .map(|p| {
                    start_ticks.insert(p.pid, p.start_ticks);
                    read::Listed {
                        pid: p.pid,
                        used_bytes: p.used_bytes,
                        kind: serde_json::from_value(serde_json::Value::String(p.kind.clone()))
                            .unwrap_or(ProcessType::Compute),
                        sm_util_pct: p.sm_util_pct,
                        gpu_instance_id: p.gpu_instance_id,
                        compute_instance_id: p.compute_instance_id,
                        mps_client: p.mps == Some(crate::mps::Role::Client),
                    }
                })
                .collect();
            // The start times are checked against the service's, not this list's moment.
            listing.at = None;
            true
        })
        .collect();
    Localized {
        answered,
        start_ticks,
    }
}

/// The facts of the process a GPU listed as `pid`, its list read at `listed_at` (boot ticks):
/// `fact`, or an unconfirmed entry where `fact` is of a process that started after that
/// moment. A process keeps its pid for life, so such a process is not the one listed: that
/// one exited after the listing and its pid was given to another (a slow GPU holds the
/// /proc read back by up to the NVML timeout). It is then never attributed nor a target.
///
/// Both sides are whole ticks rounded down (10 ms at USER_HZ 100), and a listed process
/// started no later than the moment read after its list, so it always has `start_ticks <=
/// listed_at` and is never dropped. What this cannot tell is a newcomer started later within
/// the listing's own tick: that takes the listed process exiting and the pid space wrapping
/// around to its pid within one tick.
pub(super) fn as_listed(
    pid: u32,
    fact: Arc<HostProcess>,
    listed_at: Option<u64>,
) -> Arc<HostProcess> {
    match (fact.start_ticks, listed_at) {
        (Some(started), Some(listed)) if started > listed => {
            Arc::new(HostProcess::unconfirmed(format!(
                "pid {pid} started after NVML listed it: the listed process is gone and \
                 another now has its pid"
            )))
        }
        _ => fact,
    }
}
