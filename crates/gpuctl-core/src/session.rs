//! The read road: what every reader of the GPUs opens. `gpuctl info` and Python's
//! `snapshot()`, `gpuctl top`, `gpuctl serve`, the watchdog, the Slurm commands, `kill`,
//! `clear` and `reset` (and every reader to come) open a [`Session`] (the configuration,
//! NVML under its deadline, protection, the GPUs named and resolved once) and read through
//! a [`Reader`]: what to read by purpose ([`SnapshotOptions`]), exact to the MIG instance,
//! with host facts kept across reads for long-lived readers, device-file holders on demand,
//! asking the host service from a container as a stated option, and classification on
//! demand ([`Look::classify`]). A front never composes these itself.
//!
//! ```text
//! Session::open_with(SessionOptions) -> session.places(names) -> session.reader(purpose)
//!     .places(..).holders(..).keeping_facts(..).host_only() -> take() / look() -> classify()
//! ```

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::classify::{self, Finding, History, Policy};
use crate::config::{self, FractionInForce, Loaded};
use crate::error::{CoreError, Result};
use crate::host::{FactCache, Lineage, ProcView};
use crate::nvml::{self, Gpus, Place};
use crate::pidmap::PidMap;
use crate::protect::{self, Protection};
use crate::settings;
use crate::snapshot::pods::PodNames;
use crate::snapshot::{HolderScan, Snapshot, SnapshotOptions};
use crate::units::Amount;
use crate::verify::{self, WaitReport};

/// How a session is opened. The default is what `kill` and `clear` need: the configuration
/// read (an unreadable one is an error), NVML under the deadline in force.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The NVML deadline asked for (`info --timeout`); else GPUCTL_NVML_TIMEOUT, the
    /// configuration's `nvml_timeout`, or 10 s.
    pub timeout: Option<Duration>,
    /// At most this long per GPU, whatever is configured (`top` redraws every interval).
    pub at_most: Option<Duration>,
    /// Go on with no configuration where it cannot be read: a view still shows the GPUs
    /// (`info`, Python's `snapshot()`); whatever acts refuses instead.
    pub config_optional: bool,
    /// This reader may scan for device-file holders: the device directory
    /// (GPUCTL_DEV_DIR, `dev_dir`) is checked before NVML is loaded, so a refused one stops
    /// the command first.
    pub holders: bool,
    /// Whether NVML is opened: required (the default), where it loads, or not at all.
    pub nvml: NvmlNeed,
}

impl SessionOptions {
    /// The configuration only, read as the default reads it (an unreadable one is an
    /// error): for commands that read no GPU (`slurm account`, `fleet`).
    pub fn config_only() -> SessionOptions {
        SessionOptions {
            nvml: NvmlNeed::Never,
            ..SessionOptions::default()
        }
    }
}

/// Whether a session opens NVML.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NvmlNeed {
    /// Opened, or the session fails with why: whatever reads or acts on the GPUs.
    #[default]
    Required,
    /// Opened where the library loads; where it does not, the session stands without the
    /// GPUs (`fraction`'s policy for every GPU, the trainer's NVML readings). Any other
    /// NVML failure is still an error.
    IfAvailable,
    /// Not opened: the configuration only.
    Never,
}

/// Why a session holds no NVML, said again by whatever asks it for the GPUs.
#[derive(Debug, Clone)]
struct NoNvml {
    library: String,
    reason: String,
    hint: &'static str,
}

/// The configuration, NVML and what follows from them, opened once per command (or once
/// for the life of a long-running reader), whatever reads or acts after.
pub struct Session {
    loaded: Loaded,
    /// `None`: not opened ([`NvmlNeed::Never`]), or not available ([`NvmlNeed::IfAvailable`]).
    gpus: Option<Gpus>,
    no_nvml: NoNvml,
    protection: Protection,
    dev_dir: Option<PathBuf>,
    /// GPU names resolved so far: each list is resolved once per session, however many
    /// steps of a command name it (the Slurm epilog's kill, wait and reset).
    resolved: Mutex<Vec<(Vec<String>, Vec<Place>)>>,
    /// How long opening took: the configuration read and NVML loaded and initialised.
    opened: Duration,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("gpus", &self.gpus).finish()
    }
}

impl Session {
    /// The configuration and NVML, as `kill` and `clear` open them.
    pub fn open() -> Result<Session> {
        Session::open_with(&SessionOptions::default())
    }

    /// NVML opened under the configuration already read (a service that reads its
    /// settings once at start).
    pub fn with(loaded: Loaded) -> Result<Session> {
        Session::from_loaded(
            loaded,
            &SessionOptions::default(),
            std::time::Instant::now(),
        )
    }

    pub fn open_with(options: &SessionOptions) -> Result<Session> {
        let started = std::time::Instant::now();
        let loaded = match config::load() {
            Ok(loaded) => loaded,
            // No usable system or user file means the same as an empty one: built-in
            // protection, the default threshold, /dev, the default state directory. A file
            // GPUCTL_CONFIG names is never passed over.
            Err(_) if options.config_optional && !config::is_named() => Loaded::default(),
            Err(error) => return Err(error.into()),
        };
        Session::from_loaded(loaded, options, started)
    }

    /// This session with NVML opened as [`Session::open`] opens it, where it was opened
    /// without (the Slurm commands read the configuration first: it says where their log
    /// goes, whether or not NVML then opens).
    pub fn with_nvml(mut self) -> Result<Session> {
        if self.gpus.is_none() {
            (self.gpus, self.no_nvml) = open_nvml(&self.loaded, &SessionOptions::default())?;
        }
        Ok(self)
    }

    /// `started`: when opening began (the configuration read included).
    fn from_loaded(
        loaded: Loaded,
        options: &SessionOptions,
        started: std::time::Instant,
    ) -> Result<Session> {
        let dev_dir = options
            .holders
            .then(|| config::device_dir(Some(&loaded)))
            .transpose()?;
        let (gpus, no_nvml) = open_nvml(&loaded, options)?;
        Ok(Session {
            protection: Protection::configured(&loaded.protect()),
            loaded,
            gpus,
            no_nvml,
            dev_dir,
            resolved: Mutex::new(Vec::new()),
            opened: started.elapsed(),
        })
    }

    /// The configuration this session read (empty where it was optional and unreadable).
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// The GPUs, through NVML: an error where this session holds none (the library did
    /// not load, or it was not asked for).
    pub fn gpus(&self) -> Result<&Gpus> {
        self.gpus
            .as_ref()
            .ok_or_else(|| CoreError::NvmlUnavailable {
                library: self.no_nvml.library.clone(),
                reason: self.no_nvml.reason.clone(),
                hint: self.no_nvml.hint,
            })
    }

    /// The GPUs where NVML was opened, `None` where it was not ([`NvmlNeed::IfAvailable`]).
    pub fn nvml(&self) -> Option<&Gpus> {
        self.gpus.as_ref()
    }

    /// How long opening took: the configuration read and NVML loaded and initialised.
    pub fn opened(&self) -> Duration {
        self.opened
    }

    /// The NVML GPU (and MIG GPU instance) behind CUDA device `index`, and how it was
    /// found. CUDA numbers what CUDA_VISIBLE_DEVICES (`visible`) names, in its order, up to
    /// the first entry that names nothing; each entry is resolved as `--gpu` resolves a
    /// name (an index, a GPU UUID or a unique prefix of it, a MIG UUID). Without it, the
    /// index is NVML's. A CUDA device that is no GPU is a usage error saying why.
    pub fn cuda_place(&self, index: usize, visible: Option<&str>) -> Result<(Place, String)> {
        let (place, how) = match visible {
            None => (
                self.place_of(&index.to_string(), |why| {
                    format!("NVML has no GPU {index} (CUDA_VISIBLE_DEVICES is not set): {why}")
                })?,
                "NVML's index (CUDA_VISIBLE_DEVICES is not set)".to_string(),
            ),
            Some(visible) => self.visible_place(index, visible)?,
        };
        let how = match place.gpu_instance {
            Some(_) => format!("{how}, MIG instance {place}"),
            None => how,
        };
        Ok((place, how))
    }

    /// CUDA device `index` among those `visible` (CUDA_VISIBLE_DEVICES) names.
    fn visible_place(&self, index: usize, visible: &str) -> Result<(Place, String)> {
        let shown = crate::text::escape(visible);
        let entries: Vec<&str> = match visible.trim() {
            "" => Vec::new(),
            _ => visible.split(',').map(str::trim).collect(),
        };
        let Some(wanted) = entries.get(index) else {
            return Err(CoreError::Usage(format!(
                "CUDA_VISIBLE_DEVICES={shown} makes no cuda:{index} visible"
            )));
        };
        for earlier in &entries[..index] {
            self.place_of(earlier, |why| {
                format!(
                    "CUDA_VISIBLE_DEVICES={shown} makes no cuda:{index} visible: CUDA stops at \
                     '{}', which names no GPU ({why})",
                    crate::text::escape(earlier)
                )
            })?;
        }
        let place = self.place_of(wanted, |why| {
            format!(
                "no GPU NVML lists matches '{}' of CUDA_VISIBLE_DEVICES={shown} ({why})",
                crate::text::escape(wanted)
            )
        })?;
        Ok((place, format!("CUDA_VISIBLE_DEVICES={shown}")))
    }

    /// The place `name` names; a name that names none is `worded`'s usage error, any other
    /// failure (NVML's) its own.
    fn place_of(&self, name: &str, worded: impl FnOnce(&str) -> String) -> Result<Place> {
        match self.places(&[name.to_string()]) {
            Ok(places) => places
                .and_then(|places| places.into_iter().next())
                .ok_or_else(|| CoreError::Usage(worded("an empty name"))),
            Err(CoreError::GpuSelector(why)) => Err(CoreError::Usage(worded(&why))),
            Err(other) => Err(other),
        }
    }

    /// The GPUs `names` lie on (a MIG instance named: its GPU), each once, in order; every
    /// GPU for no names.
    pub fn gpu_indices(&self, names: &[String]) -> Result<Vec<u32>> {
        match self.places(names)? {
            Some(places) => Ok(Place::gpus(&places)),
            None => Ok((0..self.gpus()?.count()?).collect()),
        }
    }

    /// The programs never signalled (built in, and the configuration's `[protect]`).
    pub fn protection(&self) -> &Protection {
        &self.protection
    }

    /// The GPUs and MIG instances `names` name, exact to the instance; `None` for no names
    /// (every GPU). Resolved once per session: naming the same list again reads nothing.
    pub fn places(&self, names: &[String]) -> Result<Option<Vec<Place>>> {
        if names.is_empty() {
            return Ok(None);
        }
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, places)) = resolved.iter().find(|(named, _)| named == names) {
            return Ok(Some(places.clone()));
        }
        let places = self.gpus()?.places(names)?;
        resolved.push((names.to_vec(), places.clone()));
        Ok(Some(places))
    }

    /// Where the NVIDIA device files are (GPUCTL_DEV_DIR, `dev_dir`, /dev).
    pub fn device_dir(&self) -> Result<PathBuf> {
        match &self.dev_dir {
            Some(dir) => Ok(dir.clone()),
            None => Ok(config::device_dir(Some(&self.loaded))?),
        }
    }

    /// The device-file holder scan: always (`every_time`), or only where a GPU has at least
    /// `holders_threshold` of memory no listed process accounts for.
    pub fn holder_scan(&self, every_time: bool) -> Result<HolderScan> {
        Ok(HolderScan {
            dev_dir: self.device_dir()?,
            above_unattributed: (!every_time).then(|| self.holders_threshold()),
        })
    }

    /// The unattributed memory worth explaining (`holders_threshold`, 1 GiB by default).
    pub fn holders_threshold(&self) -> u64 {
        self.loaded
            .holders_threshold()
            .unwrap_or(config::DEFAULT_HOLDERS_THRESHOLD)
    }

    /// A reader for `purpose` that marks protected programs and annotates device-file
    /// holders, as a person is shown them.
    pub fn reader(&self, purpose: SnapshotOptions) -> Reader {
        self.plain_reader(purpose)
            .shown_with(self.protection.clone())
    }

    /// A reader for `purpose` with nothing marked (what acts or only counts), naming pods
    /// as `[kubernetes]` says.
    pub fn plain_reader(&self, purpose: SnapshotOptions) -> Reader {
        Reader::new(purpose).naming_pods(&self.loaded.kubernetes())
    }

    /// One read of this session's GPUs by `reader`.
    pub fn take(&self, reader: &mut Reader) -> Result<Snapshot> {
        reader.take(self.gpus()?)
    }

    /// One read of this session's GPUs by `reader`, with the evidence classification reads.
    pub fn look(&self, reader: &mut Reader) -> Result<Look> {
        reader.look(self.gpus()?)
    }

    /// Polls NVML until `places` (`None`: every GPU) are free or `limit` passes (see
    /// [`verify::wait_until_free`]).
    pub fn wait_for_free(
        &self,
        places: Option<&[Place]>,
        limit: Duration,
        min_free: Option<Amount>,
    ) -> Result<WaitReport> {
        verify::wait_until_free(self.gpus()?, places, limit, min_free)
    }

    /// [`Session::wait_for_free`], saying what it waits for (see
    /// [`verify::wait_until_free_saying`]).
    pub fn wait_for_free_saying(
        &self,
        places: Option<&[Place]>,
        limit: Duration,
        min_free: Option<Amount>,
        waiting: &mut dyn FnMut(&[verify::GpuState]),
    ) -> Result<WaitReport> {
        verify::wait_until_free_saying(self.gpus()?, places, limit, min_free, waiting)
    }

    /// One look at `places`' GPUs as a person is shown them (their UUIDs, MIG instances and
    /// processes); none for no places, or where the read fails.
    pub fn look_at(&self, places: &[Place]) -> Option<Snapshot> {
        let gpus = Place::gpus(places);
        if gpus.is_empty() {
            return None;
        }
        Reader::new(SnapshotOptions::info(Some(gpus)))
            .take(self.gpus.as_ref()?)
            .ok()
    }
}

/// NVML as `options` asks for it, under the deadline in force; where it is not opened,
/// why not.
fn open_nvml(loaded: &Loaded, options: &SessionOptions) -> Result<(Option<Gpus>, NoNvml)> {
    let not_asked = NoNvml {
        library: "libnvidia-ml.so.1".into(),
        reason: "this command does not open it".into(),
        hint: "",
    };
    if options.nvml == NvmlNeed::Never {
        return Ok((None, not_asked));
    }
    let mut deadline = nvml::timeout(options.timeout, loaded.nvml_timeout())?;
    if let Some(most) = options.at_most {
        deadline = deadline.min(most);
    }
    match Gpus::open_within(deadline) {
        Ok(gpus) => Ok((Some(gpus), not_asked)),
        Err(CoreError::NvmlUnavailable {
            library,
            reason,
            hint,
        }) if options.nvml == NvmlNeed::IfAvailable => Ok((
            None,
            NoNvml {
                library,
                reason,
                hint,
            },
        )),
        Err(error) => Err(error),
    }
}

/// What a snapshot's processes are marked with.
#[derive(Debug, Clone)]
enum Marks {
    None,
    /// Protected programs among device-file holders, where the scan ran: tools, not
    /// suspects (what a reclaim needs).
    Holders(Protection),
    /// Every protected program marked, and every device-file holder annotated with what it
    /// is suspected to be: what a person is shown.
    Shown(Protection),
}

/// Reads snapshots for one purpose, again and again if asked: what to read, which places,
/// and what to keep between reads. Holds no NVML of its own: each read is given the GPUs
/// (a session's, or the watchdog's link, which reopens NVML after a driver reload).
#[derive(Debug)]
pub struct Reader {
    options: SnapshotOptions,
    places: Option<Vec<Place>>,
    localize: bool,
    marks: Marks,
    facts: Option<FactCache>,
    view: Option<ProcView>,
    /// The configuration each read's health verdicts are judged under, where asked.
    health: Option<Loaded>,
    /// Shows who holds each GPU's `gpuctl run` lease.
    leases: bool,
    /// Names pods by namespace and name, as the node's container runtime gives them.
    pods: PodNames,
}

/// A snapshot with the evidence classification reads: its processes' lineages.
#[derive(Debug)]
pub struct Look {
    pub snapshot: Snapshot,
    pub lineages: PidMap<u32, Lineage>,
}

impl Look {
    /// The findings of this look: `history` is what only a watcher over time knows (the
    /// watchdog's), `policy` which rules apply and how.
    pub fn classify(&self, history: Option<&History>, policy: &Policy) -> Vec<Finding> {
        classify::classify(&self.snapshot, &self.lineages, history, policy)
    }
}

impl Reader {
    /// Reads what `purpose` says (see [`SnapshotOptions`]'s constructors), of every GPU,
    /// /proc afresh each time, asking the host service from inside a container where one
    /// answers; nothing marked.
    pub fn new(purpose: SnapshotOptions) -> Reader {
        Reader {
            options: purpose,
            places: None,
            localize: true,
            marks: Marks::None,
            facts: None,
            view: None,
            health: None,
            leases: false,
            pods: PodNames::configured(&config::Kubernetes::default()),
        }
    }

    /// Only these GPUs and MIG instances (`None`: every GPU): a GPU named whole is read
    /// whole; of a GPU whose instances were named one by one, only those instances are
    /// shown.
    pub fn places(mut self, places: Option<Vec<Place>>) -> Reader {
        self.options.gpus = places.as_deref().map(Place::gpus);
        self.places = places;
        self
    }

    /// The places it reads (`None`: every GPU).
    pub fn named_places(&self) -> Option<&[Place]> {
        self.places.as_deref()
    }

    /// Also look for the device-file holders NVML does not list, as `scan` says.
    pub fn holders(mut self, scan: Option<HolderScan>) -> Reader {
        self.options.holders = scan;
        self
    }

    /// [`Reader::holders`] for the reads from now on (`top` while its panel is open).
    pub fn set_holders(&mut self, scan: Option<HolderScan>) {
        self.options.holders = scan;
    }

    /// Reads what `purpose` says from now on, on the same places (the watchdog's options
    /// follow its settings and when its holder scan is due).
    pub fn set_purpose(&mut self, purpose: SnapshotOptions) {
        let gpus = self.options.gpus.take();
        self.options = SnapshotOptions { gpus, ..purpose };
    }

    /// Never ask the host service, even in a PID namespace of its own: NVML's host pids are
    /// read as they are (the service itself, and readers that keep facts by pid).
    pub fn host_only(mut self) -> Reader {
        self.localize = false;
        self
    }

    /// Keeps host facts across reads in `cache` (see [`FactCache`]): a process seen before
    /// with the same start time costs a read of its stat. For readers that read again and
    /// again (`top`, `serve`, the watchdog).
    pub fn keeping_facts(mut self, cache: FactCache) -> Reader {
        self.facts = Some(cache);
        self
    }

    /// New periods for the facts kept (see [`FactCache::retime`]); nothing where none are.
    pub fn retime_facts(&mut self, refresh_every: Duration, whole_every: Duration) {
        if let Some(facts) = &mut self.facts {
            facts.retime(refresh_every, whole_every);
        }
    }

    /// Marks protected programs and annotates device-file holders, as a person is shown them.
    pub fn shown_with(mut self, protection: Protection) -> Reader {
        self.marks = Marks::Shown(protection);
        self
    }

    /// Marks the protected programs among device-file holders, where the scan ran (a
    /// reclaim's holders that are tools are not suspects).
    pub fn marking_holders(mut self, protection: Protection) -> Reader {
        self.marks = Marks::Holders(protection);
        self
    }

    /// Judges each GPU's health on every read (its verdict, as `info`, `top` and `gpuctl
    /// health` show it): `loaded`'s Xid catalog, and the watchdog's Xid log and the admins'
    /// acknowledgements as they are at that read, so a verdict clears when the GPU does.
    pub fn judging_health(mut self, loaded: &Loaded) -> Reader {
        self.health = Some(loaded.clone());
        self
    }

    /// Shows who holds each GPU's and MIG instance's `gpuctl run` lease, asked of each lease
    /// file on every read (`info`, `top`): never of the kernel's lock table.
    pub fn showing_leases(mut self) -> Reader {
        self.leases = true;
        self
    }

    /// Names pods where `[kubernetes]` says to ask (a reader without it asks the runtime at
    /// its usual socket), keeping the names of the pods seen on a GPU in the state
    /// directory for after the runtime forgets them.
    pub fn naming_pods(mut self, kubernetes: &config::Kubernetes) -> Reader {
        let last_known = crate::snapshot::peaks::state_dir()
            .map(|dir| dir.join(crate::snapshot::last_known::FILE_NAME));
        self.pods = PodNames::configured(kubernetes).remembering(last_known);
        self
    }

    /// One snapshot of `gpus`, as this reader reads it.
    pub fn take(&mut self, gpus: &Gpus) -> Result<Snapshot> {
        let view = self.view()?;
        let taken = Snapshot::take_from(
            gpus,
            &view,
            &self.options,
            self.localize,
            self.facts.as_mut(),
        );
        // Kept for the next read only after one that worked (a broken read starts afresh).
        let mut snapshot = taken?;
        self.view = Some(view);
        if let Some(places) = &self.places {
            keep_named_instances(&mut snapshot, places);
        }
        // Before the marks: a protection pattern may name a pod.
        self.pods.name(&mut snapshot);
        match &self.marks {
            Marks::None => {}
            Marks::Holders(protection) => {
                if snapshot.devices.iter().any(|gpu| gpu.holders.is_some()) {
                    protect::mark_claims(&mut snapshot, protection);
                }
            }
            Marks::Shown(protection) => {
                protect::mark_claims(&mut snapshot, protection);
                classify::holders::annotate(&mut snapshot);
            }
        }
        if let Some(loaded) = &self.health {
            crate::checkup::Judge::load(Some(loaded)).annotate(&mut snapshot);
        }
        if self.leases {
            show_leases(&mut snapshot);
        }
        Ok(snapshot)
    }

    /// [`Reader::take`] and the lineage of every confirmed process, the evidence
    /// classification reads (kept in the fact cache, where there is one).
    pub fn look(&mut self, gpus: &Gpus) -> Result<Look> {
        let snapshot = self.take(gpus)?;
        let view = self.view.as_ref().expect("a read keeps its view");
        let lineages = match &mut self.facts {
            Some(cache) => snapshot.lineages_cached(view, cache),
            None => snapshot.lineages(view),
        };
        Ok(Look { snapshot, lineages })
    }

    /// The /proc view: the last read's, its clock read again, or a new one.
    fn view(&mut self) -> Result<ProcView> {
        let read = match self.view.take() {
            Some(mut view) => view.refresh_uptime().map(|()| view),
            None => ProcView::system(),
        };
        read.map_err(|source| CoreError::Io {
            path: "/proc/uptime".into(),
            source,
        })
    }
}

/// Each GPU's leases and its MIG instances', from the lease directory where there is one.
fn show_leases(snapshot: &mut Snapshot) {
    let Some(dir) = crate::lease::LeaseDir::existing() else {
        return;
    };
    let mut uuids: Vec<(u32, Option<u32>, String)> = Vec::new();
    for gpu in &snapshot.devices {
        uuids.extend(gpu.uuid.clone().map(|uuid| (gpu.index, None, uuid)));
        for mig in &gpu.mig_devices {
            if let Some(uuid) = &mig.uuid {
                uuids.push((gpu.index, mig.gpu_instance_id, uuid.clone()));
            }
        }
    }
    let names: Vec<String> = uuids.iter().map(|(_, _, uuid)| uuid.clone()).collect();
    for (uuid, holder) in dir.holders(&names) {
        let Some((index, gpu_instance, _)) = uuids.iter().find(|(_, _, u)| *u == uuid) else {
            continue;
        };
        if let Some(gpu) = snapshot.devices.iter_mut().find(|g| g.index == *index) {
            gpu.leases.push(crate::lease::Leased {
                uuid,
                gpu_instance: *gpu_instance,
                holder,
            });
        }
    }
}

/// On a GPU whose instances were named one by one (and not the GPU whole), only those
/// instances are shown.
fn keep_named_instances(snapshot: &mut Snapshot, places: &[Place]) {
    for gpu in &mut snapshot.devices {
        let whole = places
            .iter()
            .any(|p| p.gpu == gpu.index && p.gpu_instance.is_none());
        if !whole {
            gpu.mig_devices
                .retain(|m| places.iter().any(|p| p.holds(gpu.index, m.gpu_instance_id)));
        }
    }
}

/// Which memory share in force to look up: for `user`'s processes, on the GPUs `gpus`
/// names (none: every GPU).
#[derive(Debug, Clone, Default)]
pub struct ShareRequest {
    /// `None`: no user is known, so only GPU and default entries apply.
    pub user: Option<String>,
    pub gpus: Vec<String>,
}

impl ShareRequest {
    /// For the user this process runs as.
    pub fn for_caller() -> ShareRequest {
        ShareRequest {
            user: config::caller_name(),
            gpus: Vec::new(),
        }
    }
}

/// The share in force on one GPU, or (`index: None`) the one that applies to every GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareInForce {
    pub index: Option<u32>,
    pub uuid: Option<String>,
    /// `None`: no limit.
    pub share: Option<FractionInForce>,
}

impl Session {
    /// The shares `request` asks for (what `gpuctl fraction` and the Python package's
    /// `fraction()` report): with NVML, one per GPU named (a MIG instance: its GPU's), or
    /// per GPU of this machine when none is named; without it, or on a machine with no GPU,
    /// the one share that applies to every GPU. A GPU entry beats a user entry beats the
    /// default (see [`config::fraction_for`]).
    pub fn shares(&self, request: &ShareRequest) -> Result<Vec<ShareInForce>> {
        let user = request.user.as_deref();
        let on_gpus: Vec<(u32, Option<String>)> = match &self.gpus {
            None => Vec::new(),
            Some(gpus) => {
                let uuids = gpus.uuids()?;
                self.gpu_indices(&request.gpus)?
                    .into_iter()
                    .map(|index| (index, uuids.get(index as usize).cloned().flatten()))
                    .collect()
            }
        };
        if on_gpus.is_empty() {
            return Ok(vec![self.share_on_every_gpu(user)]);
        }
        Ok(on_gpus
            .into_iter()
            .map(|(index, uuid)| ShareInForce {
                share: config::share_for(&self.loaded, Some((index, uuid.as_deref())), user),
                index: Some(index),
                uuid,
            })
            .collect())
    }

    /// The share that applies to every GPU, for `user`'s processes.
    fn share_on_every_gpu(&self, user: Option<&str>) -> ShareInForce {
        ShareInForce {
            index: None,
            uuid: None,
            share: config::share_for(&self.loaded, None, user),
        }
    }

    /// `gpuctl enable`'s settings for a program whose environment `environ` reads (its own
    /// values kept), with the caller's share on the first of `named` GPUs or, with none
    /// named, on every GPU: what `enable` prints or runs a command with, what `gpuctl run`
    /// adds, and what the Python package sets.
    pub fn allocator_env(
        &self,
        named: &[String],
        environ: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Vec<settings::EnvSetting>, Option<FractionInForce>)> {
        let caller = ShareRequest::for_caller();
        let share = match named {
            [] => self.share_on_every_gpu(caller.user.as_deref()),
            _ => {
                let request = ShareRequest {
                    gpus: named.to_vec(),
                    ..caller
                };
                let mut found = self.shares(&request)?;
                found.swap_remove(0)
            }
        };
        let fraction = share.share;
        let env = settings::enable_env(environ, fraction.as_ref().map(|f| f.value));
        Ok((env, fraction))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{GpuSnapshot, MigDevice};

    fn mig(gi: u32) -> MigDevice {
        MigDevice {
            uuid: None,
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            profile: None,
            memory: None,
            processes: Vec::new(),
        }
    }

    fn gpu(index: u32, instances: &[u32]) -> GpuSnapshot {
        let mut gpu = GpuSnapshot::unread(index);
        gpu.mig_devices = instances.iter().map(|&gi| mig(gi)).collect();
        gpu
    }

    #[test]
    fn an_instance_named_alone_is_all_of_its_gpu_shown_and_a_whole_gpu_stays_whole() {
        let mut snapshot = Snapshot::of(vec![gpu(0, &[1, 9, 10]), gpu(1, &[2, 3])]);
        let nine = Place {
            gpu: 0,
            gpu_instance: Some(9),
        };
        keep_named_instances(&mut snapshot, &[nine, Place::whole(1)]);
        let shown = |i: usize| -> Vec<Option<u32>> {
            snapshot.devices[i]
                .mig_devices
                .iter()
                .map(|m| m.gpu_instance_id)
                .collect()
        };
        assert_eq!(shown(0), [Some(9)]);
        assert_eq!(shown(1), [Some(2), Some(3)]);
    }

    #[test]
    fn a_reader_reads_the_gpus_of_its_places_and_keeps_them_across_purposes() {
        let nine = Place {
            gpu: 2,
            gpu_instance: Some(9),
        };
        let mut reader =
            Reader::new(SnapshotOptions::info(None)).places(Some(vec![nine, Place::whole(0)]));
        assert_eq!(reader.options.gpus, Some(vec![0, 2]));
        reader.set_purpose(SnapshotOptions::watch(true));
        assert_eq!(reader.options.gpus, Some(vec![0, 2]));
        assert!(reader.options.only_memory_and_processes);
        assert!(reader.localize, "asks the host service unless told not to");
        assert!(!reader.host_only().localize);
    }
}
