//! `--resume`: where a run starts, read from its checkpoint.

use tch::{Kind, Tensor};

use crate::checkpoint;
use crate::cli::Args;
use crate::failure::{Failure, log};
use crate::optim::AdamW;

/// Where a run starts: after the checkpoint it resumes, or at step 0.
#[derive(Debug, Default)]
pub struct Resumed {
    pub step: u64,
    pub samples_seen: u64,
    pub oom_recoveries: u64,
    /// The micro-batch the previous run had come down to.
    pub micro_batch: Option<u32>,
}

/// `--resume`: loads the checkpoint into the parameters and the optimizer, if there is one.
pub fn resume(
    args: &Args,
    fingerprint: checkpoint::Fingerprint,
    params: &[(String, Tensor)],
    optimizer: &mut AdamW,
) -> Result<Resumed, Failure> {
    if !args.resume {
        return Ok(Resumed::default());
    }
    let dir = args
        .checkpoint
        .as_deref()
        .expect("clap: --resume requires --checkpoint");
    let Some(loaded) = checkpoint::load(dir).map_err(Failure::Failed)? else {
        log(format!(
            "no checkpoint in {} yet: starting at step 0",
            dir.display()
        ));
        return Ok(Resumed::default());
    };
    if loaded.state.fingerprint != fingerprint {
        return Err(Failure::Usage(format!(
            "{} was written by a different run (model, batch size, dataset or seed differ: \
             {:?}); resume with the same options or use another --checkpoint",
            loaded.path.display(),
            loaded.state.fingerprint
        )));
    }
    restore(params, &loaded.model).map_err(Failure::Failed)?;
    optimizer
        .load_state(params, &loaded.optimizer, loaded.state.step as i64)
        .map_err(Failure::Failed)?;
    log(format!(
        "resumed from {} at step {}",
        loaded.path.display(),
        loaded.state.step
    ));
    Ok(Resumed {
        step: loaded.state.step,
        samples_seen: loaded.state.samples_seen,
        oom_recoveries: loaded.state.oom_recoveries,
        micro_batch: Some(loaded.state.micro_batch),
    })
}

/// Copies checkpointed values into the model's parameters.
fn restore(params: &[(String, Tensor)], saved: &[(String, Tensor)]) -> Result<(), String> {
    tch::no_grad(|| {
        for (name, param) in params {
            let value = saved
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| format!("the checkpoint lacks parameter {name}"))?;
            if value.size() != param.size() || value.kind() != Kind::Float {
                return Err(format!("the checkpoint's {name} has another shape or type"));
            }
            param
                .shallow_clone()
                .copy_(&value.to_device(param.device()));
        }
        Ok(())
    })
}
