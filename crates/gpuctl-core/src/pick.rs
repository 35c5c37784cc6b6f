//! Which GPUs a launcher may have (`gpuctl run`, `gpuctl pick`, Python's `pick()`): a reader
//! on the read road, and the leases. A GPU (or a MIG instance, where a GPU is split)
//! qualifies when its health verdict is `none`, it is free as `clear --wait` judges free
//! (or, with a minimum free amount or a utilization limit, by those instead), and, for a
//! run, no other run holds its lease.

use std::time::{Duration, Instant};

use crate::error::{CoreError, Result};
use crate::exit::Exit;
use crate::health::Action;
use crate::lease::{Lease, LeaseDir, LeaseError, Taken};
use crate::nvml::Place;
use crate::session::{Reader, Session};
use crate::snapshot::{GpuSnapshot, GpuStatus, Snapshot, SnapshotOptions};
use crate::units::{self, Amount};
use crate::verify;

/// What a GPU must offer beyond health.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Criteria {
    /// At least this much free memory (instead of `clear --wait`'s "no process and under
    /// 256 MiB in use").
    pub min_free: Option<Amount>,
    /// Utilization under this percentage.
    pub max_util: Option<u32>,
}

/// One GPU or MIG instance as a launcher sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Spot {
    pub place: Place,
    /// `GPU-…`, or `MIG-…` for an instance: what `CUDA_VISIBLE_DEVICES` names.
    pub uuid: Option<String>,
    /// Its memory, where read.
    pub total_bytes: Option<u64>,
    /// Why it does not qualify; `None` when it does.
    pub unfit: Option<String>,
}

impl Spot {
    pub fn fit(&self) -> bool {
        self.unfit.is_none()
    }

    /// "0", or "0/3" for GPU 0's instance 3 (as nvidia-smi -L shows them).
    pub fn name(&self) -> String {
        match self.place.gpu_instance {
            Some(instance) => format!("{}/{instance}", self.place.gpu),
            None => self.place.gpu.to_string(),
        }
    }

    /// "GPU 0 (GPU-…)" or "MIG 0/3 (MIG-…)".
    pub fn describe(&self) -> String {
        match &self.uuid {
            Some(uuid) => format!("{} ({uuid})", self.short()),
            None => self.short(),
        }
    }

    /// "GPU 0" or "MIG 0/3": enough to tell places apart in a line about each of them.
    pub fn short(&self) -> String {
        let kind = if self.place.gpu_instance.is_some() {
            "MIG"
        } else {
            "GPU"
        };
        format!("{kind} {}", self.name())
    }
}

/// Every place `named` names (`None`: each GPU, or each MIG instance of a split GPU), judged
/// against `criteria`. Pure: the snapshot holds all it reads.
pub fn judge(snapshot: &Snapshot, named: Option<&[Place]>, criteria: &Criteria) -> Vec<Spot> {
    let places: Vec<Place> = match named {
        Some(places) => places.to_vec(),
        None => snapshot
            .devices
            .iter()
            .flat_map(|gpu| {
                let split = gpu.mig_enabled == Some(true) && !gpu.mig_devices.is_empty();
                let instances: Vec<Place> = if split {
                    gpu.mig_devices
                        .iter()
                        .filter_map(|m| m.gpu_instance_id)
                        .map(|gi| Place {
                            gpu: gpu.index,
                            gpu_instance: Some(gi),
                        })
                        .collect()
                } else {
                    vec![Place::whole(gpu.index)]
                };
                instances
            })
            .collect(),
    };
    places
        .into_iter()
        .map(
            |place| match snapshot.devices.iter().find(|g| g.index == place.gpu) {
                Some(gpu) => spot(gpu, place, criteria),
                None => Spot {
                    place,
                    uuid: None,
                    total_bytes: None,
                    unfit: Some("not read".into()),
                },
            },
        )
        .collect()
}

fn spot(gpu: &GpuSnapshot, place: Place, criteria: &Criteria) -> Spot {
    let mig = place.gpu_instance.and_then(|gi| {
        gpu.mig_devices
            .iter()
            .find(|m| m.gpu_instance_id == Some(gi))
    });
    let uuid = match place.gpu_instance {
        Some(_) => mig.and_then(|m| m.uuid.clone()),
        None => gpu.uuid.clone(),
    };
    let total_bytes = match place.gpu_instance {
        Some(_) => mig.and_then(|m| m.memory).map(|m| m.total_bytes),
        None => gpu.memory.map(|m| m.total_bytes),
    };
    let unfit = unfit(gpu, place, criteria, uuid.is_some());
    Spot {
        place,
        uuid,
        total_bytes,
        unfit,
    }
}

/// Why `place` of `gpu` does not qualify, first reason first.
fn unfit(gpu: &GpuSnapshot, place: Place, criteria: &Criteria, has_uuid: bool) -> Option<String> {
    if gpu.status == GpuStatus::Lost || gpu.status == GpuStatus::NotAnswering {
        return Some(
            gpu.error
                .clone()
                .unwrap_or_else(|| "does not answer".into()),
        );
    }
    if let Some(verdict) = &gpu.health
        && verdict.action != Action::None
    {
        return Some(
            verdict
                .summary()
                .unwrap_or_else(|| verdict.action.name().into()),
        );
    }
    if !has_uuid {
        return Some("its UUID could not be read".into());
    }
    let state = match place.gpu_instance {
        Some(gi) => verify::instance_state(gpu, gi, criteria.min_free),
        None => verify::gpu_state(gpu, criteria.min_free),
    };
    let judged_by_memory = criteria.min_free.is_some() || criteria.max_util.is_none();
    if judged_by_memory && !state.free {
        return Some(
            match (criteria.min_free, state.free_bytes, state.used_bytes) {
                (_, None, _) | (_, _, None) => "its memory could not be read".into(),
                (Some(_), Some(free), _) => format!("only {} free", units::bytes(free)),
                (None, _, Some(used)) if !state.processes.is_empty() => format!(
                    "busy: {} process{} ({} in use)",
                    state.processes.len(),
                    units::plural(state.processes.len(), "es"),
                    units::bytes(used)
                ),
                (None, _, Some(used)) => format!("{} in use", units::bytes(used)),
            },
        );
    }
    if let Some(limit) = criteria.max_util {
        match gpu.utilization {
            Some(util) if util.gpu_pct < limit => {}
            Some(util) => return Some(format!("{} % utilized", util.gpu_pct)),
            None => return Some("its utilization could not be read".into()),
        }
    }
    None
}

/// What a launcher asks for.
#[derive(Debug, Clone, Default)]
pub struct PickRequest {
    /// GPUs or MIG instances named (index, UUID, bus id, GPU/GI): all of them, or none.
    pub gpus: Vec<String>,
    /// How many, from every qualifying place (`None` with `gpus` named: those).
    pub count: Option<usize>,
    pub criteria: Criteria,
    /// How long to wait for enough to qualify (a run: and for their leases).
    pub wait: Option<Duration>,
}

/// Why nothing was picked.
#[derive(Debug, thiserror::Error)]
pub enum PickError {
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// Too few places qualify (or, for a run, are free of leases): what is missing.
    #[error("{0}")]
    TooFew(String),
}

impl PickError {
    /// The documented exit status: too few GPUs is 4, as for `clear --wait`.
    pub fn exit(&self) -> Exit {
        match self {
            PickError::Core(error) => error.exit(),
            PickError::Lease(error) => error.exit(),
            PickError::TooFew(_) => Exit::NotClean,
        }
    }
}

/// How often the places are read again while waiting.
const WAIT_POLL: Duration = Duration::from_millis(200);

/// Picks places on one session's read road.
pub struct Picker<'a> {
    session: &'a Session,
    reader: Reader,
    named: Option<Vec<Place>>,
    request: PickRequest,
    checked: bool,
}

impl<'a> Picker<'a> {
    /// Checks the request and resolves its names once.
    pub fn new(session: &'a Session, request: PickRequest) -> Result<Picker<'a>> {
        if request.count == Some(0) {
            return Err(CoreError::Usage(
                "at least one GPU must be asked for".into(),
            ));
        }
        if request.count.is_some() && !request.gpus.is_empty() {
            return Err(CoreError::Usage(
                "ask for a number of GPUs or name them, not both".into(),
            ));
        }
        if let Some(limit) = request.criteria.max_util
            && !(1..=100).contains(&limit)
        {
            return Err(CoreError::Usage(format!(
                "a utilization limit of {limit} %: give 1 to 100"
            )));
        }
        let named = session.places(&request.gpus)?;
        let reader = session
            .plain_reader(SnapshotOptions::pick(named.as_deref().map(Place::gpus)))
            .places(named.clone())
            .judging_health(session.loaded());
        Ok(Picker {
            session,
            reader,
            named,
            request,
            checked: false,
        })
    }

    /// Every place considered, judged now.
    pub fn look(&mut self) -> Result<Vec<Spot>> {
        let snapshot = self.session.take(&mut self.reader)?;
        let spots = judge(&snapshot, self.named.as_deref(), &self.request.criteria);
        if !self.checked {
            if let Some(count) = self.request.count
                && count > spots.len()
            {
                return Err(CoreError::Usage(format!(
                    "{count} GPUs asked for, but only {} {} here",
                    spots.len(),
                    if spots.len() == 1 { "is" } else { "are" }
                )));
            }
            self.check_min_free(&spots)?;
            self.checked = true;
        }
        Ok(spots)
    }

    /// A minimum free amount no place considered could ever have is bad input, not a wait.
    fn check_min_free(&self, spots: &[Spot]) -> Result<()> {
        let Some(Amount::Bytes(wanted)) = self.request.criteria.min_free else {
            return Ok(());
        };
        let too_small = |s: &&Spot| s.total_bytes.is_some_and(|total| total < wanted);
        let offending = if self.named.is_some() {
            spots.iter().find(too_small)
        } else if spots.iter().all(|s| too_small(&s)) {
            spots.iter().max_by_key(|s| s.total_bytes)
        } else {
            None
        };
        match offending {
            Some(spot) => Err(CoreError::Usage(format!(
                "a minimum free of {} is more than {} has ({})",
                units::bytes(wanted),
                spot.describe(),
                units::bytes(spot.total_bytes.unwrap_or(0))
            ))),
            None => Ok(()),
        }
    }

    fn wanted(&self, spots: &[Spot]) -> usize {
        self.request.count.unwrap_or(match &self.named {
            Some(_) => spots.len(),
            None => 1,
        })
    }

    /// The places that qualify now, without leases (`gpuctl pick`): the first ones by index,
    /// or what is missing. Waits as asked for enough to qualify.
    pub fn pick(&mut self, waiting: &mut dyn FnMut(&str)) -> Result<Vec<Spot>, PickError> {
        let started = Instant::now();
        let mut said = String::new();
        loop {
            let spots = self.look()?;
            let wanted = self.wanted(&spots);
            let fit: Vec<Spot> = spots.iter().filter(|s| s.fit()).cloned().collect();
            if fit.len() >= wanted && (self.named.is_none() || fit.len() == spots.len()) {
                return Ok(fit.into_iter().take(wanted).collect());
            }
            let missing = missing(&spots, wanted, &[], &[]);
            self.wait_or_fail(started, missing, &mut said, waiting)?;
        }
    }

    /// Leases the places asked for, all or nothing (see [`LeaseDir::take`]): the places and
    /// their leases, or what is missing. Waits as asked, saying who holds what it waits for.
    pub fn lease(
        &mut self,
        dir: &LeaseDir,
        waiting: &mut dyn FnMut(&str),
    ) -> Result<Vec<(Spot, Lease)>, PickError> {
        let started = Instant::now();
        let mut said = String::new();
        loop {
            let spots = self.look()?;
            let wanted = self.wanted(&spots);
            let fit: Vec<&Spot> = spots.iter().filter(|s| s.fit()).collect();
            let every_named = self.named.is_some() && fit.len() < spots.len();
            let mut leased_by: Vec<(String, String)> = Vec::new();
            let mut refused: Vec<(String, String)> = Vec::new();
            if fit.len() >= wanted && !every_named {
                let uuids: Vec<String> = fit.iter().filter_map(|s| s.uuid.clone()).collect();
                let count = self.named.is_none().then_some(wanted);
                dir.ensure(&uuids);
                let (taken, missed) = dir.take(&uuids, count)?;
                if let Some(leases) = taken {
                    // Taken in UUID order; handed out in the GPUs' own order.
                    let mut leased: Vec<(Spot, Lease)> = leases
                        .into_iter()
                        .filter_map(|lease| {
                            let spot = fit.iter().find(|s| s.uuid.as_ref() == Some(&lease.uuid))?;
                            Some(((*spot).clone(), lease))
                        })
                        .collect();
                    leased.sort_by_key(|(spot, _)| (spot.place.gpu, spot.place.gpu_instance));
                    return Ok(leased);
                }
                let busy: Vec<String> = missed
                    .iter()
                    .filter(|(_, taken)| matches!(taken, Taken::Busy))
                    .map(|(uuid, _)| uuid.clone())
                    .collect();
                for (uuid, holder) in dir.holders(&busy) {
                    leased_by.push((uuid, holder.describe()));
                }
                for (uuid, taken) in missed {
                    match taken {
                        Taken::Refused(why) => refused.push((uuid, why)),
                        Taken::Busy if !leased_by.iter().any(|(u, _)| *u == uuid) => {
                            leased_by.push((uuid, "another run".into()))
                        }
                        _ => {}
                    }
                }
            }
            let missing = missing(&spots, wanted, &leased_by, &refused);
            self.wait_or_fail(started, missing, &mut said, waiting)?;
        }
    }

    fn wait_or_fail(
        &self,
        started: Instant,
        missing: String,
        said: &mut String,
        waiting: &mut dyn FnMut(&str),
    ) -> Result<(), PickError> {
        let Some(limit) = self.request.wait else {
            return Err(PickError::TooFew(missing));
        };
        if started.elapsed() >= limit {
            return Err(PickError::TooFew(format!(
                "{missing} (waited {:.1} s)",
                started.elapsed().as_secs_f64()
            )));
        }
        if *said != missing {
            waiting(&format!("waiting: {missing}"));
            *said = missing;
        }
        std::thread::sleep(WAIT_POLL.min(limit.saturating_sub(started.elapsed())));
        Ok(())
    }
}

/// One line: how many are wanted and qualify, and why each other place does not.
fn missing(
    spots: &[Spot],
    wanted: usize,
    leased_by: &[(String, String)],
    refused: &[(String, String)],
) -> String {
    let available = spots
        .iter()
        .filter(|s| {
            s.fit()
                && !s.uuid.as_ref().is_some_and(|u| {
                    leased_by.iter().any(|(l, _)| l == u) || refused.iter().any(|(r, _)| r == u)
                })
        })
        .count();
    let mut reasons: Vec<String> = Vec::new();
    for spot in spots {
        let uuid = spot.uuid.as_deref().unwrap_or("");
        let why = match &spot.unfit {
            Some(why) => why.clone(),
            None => match leased_by.iter().find(|(u, _)| u == uuid) {
                Some((_, by)) => format!("leased by {by}"),
                None => match refused.iter().find(|(u, _)| u == uuid) {
                    Some((_, why)) => why.clone(),
                    None => continue,
                },
            },
        };
        // By index only: UUIDs for every GPU of a server would bury the reasons.
        reasons.push(format!("{}: {why}", spot.short()));
    }
    let head = if spots.is_empty() {
        "no GPU found".to_string()
    } else {
        format!(
            "{wanted} GPU{} wanted, {available} free and healthy",
            units::plural(wanted, "s")
        )
    };
    if reasons.is_empty() {
        head
    } else {
        format!("{head}; {}", reasons.join("; "))
    }
}

#[cfg(test)]
mod tests;
