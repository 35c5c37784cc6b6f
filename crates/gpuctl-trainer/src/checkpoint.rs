//! Checkpoints: `DIR/step-NNNNNNNN/` holds the model and optimizer tensors (safetensors) and
//! the run's state (JSON); `DIR/latest` names the newest complete one. A checkpoint is
//! written under a temporary name and renamed into place, then `latest` is replaced
//! atomically, so a crash at any moment leaves the previous checkpoint intact.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::model::ModelConfig;

/// What must match for a checkpoint to be resumed by a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub model: ModelConfig,
    pub batch_size: u32,
    pub dataset_size: u64,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    /// Optimizer steps completed: the resumed run starts at this step.
    pub step: u64,
    pub samples_seen: u64,
    /// The micro-batch in use when saved (smaller than asked for after an OOM recovery).
    pub micro_batch: u32,
    pub oom_recoveries: u64,
    pub loss: Option<f64>,
    pub fingerprint: Fingerprint,
}

pub struct Loaded {
    pub state: State,
    pub model: Vec<(String, Tensor)>,
    pub optimizer: Vec<(String, Tensor)>,
    pub path: PathBuf,
}

const LATEST: &str = "latest";
/// Checkpoints kept: the newest and the one before it.
const KEEP: usize = 2;

pub fn save(
    dir: &Path,
    model: &[(String, Tensor)],
    optimizer: &[(String, Tensor)],
    state: &State,
) -> Result<PathBuf, String> {
    let name = format!("step-{:08}", state.step);
    let target = dir.join(&name);
    let partial = dir.join(format!(".{name}.partial-{}", std::process::id()));
    let context = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    fs::create_dir_all(dir).map_err(|e| context(&format!("creating {}", dir.display()), &e))?;
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir(&partial)
        .map_err(|e| context(&format!("creating {}", partial.display()), &e))?;
    Tensor::write_safetensors(model, partial.join("model.safetensors"))
        .map_err(|e| context("writing the model", &e))?;
    Tensor::write_safetensors(optimizer, partial.join("optimizer.safetensors"))
        .map_err(|e| context("writing the optimizer state", &e))?;
    let json = serde_json::to_vec_pretty(state).expect("the state serializes");
    fs::write(partial.join("state.json"), json).map_err(|e| context("writing state.json", &e))?;
    for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        sync(&partial.join(file)).map_err(|e| context(&format!("syncing {file}"), &e))?;
    }
    sync(&partial).map_err(|e| context("syncing the checkpoint", &e))?;
    if target.exists() {
        fs::remove_dir_all(&target)
            .map_err(|e| context(&format!("replacing {}", target.display()), &e))?;
    }
    fs::rename(&partial, &target)
        .map_err(|e| context(&format!("renaming into {}", target.display()), &e))?;
    write_atomically(&dir.join(LATEST), format!("{name}\n").as_bytes())
        .map_err(|e| context("updating latest", &e))?;
    prune(dir);
    Ok(target)
}

/// The newest complete checkpoint in `dir`, if there is one.
pub fn load(dir: &Path) -> Result<Option<Loaded>, String> {
    let latest = match fs::read_to_string(dir.join(LATEST)) {
        Ok(text) => text.trim().to_string(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", dir.join(LATEST).display())),
    };
    if latest.is_empty() || latest.contains('/') {
        return Err(format!(
            "{} does not name a checkpoint",
            dir.join(LATEST).display()
        ));
    }
    let path = dir.join(&latest);
    let state: State = fs::read(path.join("state.json"))
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
        .map_err(|e| format!("{}: {e}", path.join("state.json").display()))?;
    let read = |file: &str| {
        Tensor::read_safetensors(path.join(file))
            .map_err(|e| format!("{}: {e}", path.join(file).display()))
    };
    Ok(Some(Loaded {
        state,
        model: read("model.safetensors")?,
        optimizer: read("optimizer.safetensors")?,
        path,
    }))
}

/// Removes all but the newest `KEEP` checkpoints, and partial ones of dead writers.
fn prune(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut steps: Vec<PathBuf> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("step-") {
            steps.push(entry.path());
        } else if name.starts_with(".step-") && !name.ends_with(&format!("-{}", std::process::id()))
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    steps.sort();
    let excess = steps.len().saturating_sub(KEEP);
    for old in &steps[..excess] {
        let _ = fs::remove_dir_all(old);
    }
}

fn sync(path: &Path) -> io::Result<()> {
    fs::File::open(path)?.sync_all()
}

/// Replaces `path` with `bytes`, durably: a crash leaves the old file or the whole new one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    gpuctl_core::files::replace(path, bytes, 0o644, true)
}
