//! AdamW with its state in plain tensors, so a checkpoint holds all of it and a resumed run
//! continues exactly (tch's optimizer keeps its moments inside libtorch, out of reach).

use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

pub struct AdamW {
    pub config: AdamWConfig,
    /// Optimizer steps taken (the bias correction's t).
    pub steps: i64,
    /// First and second moments, one pair per parameter, in `params` order.
    moments: Vec<(Tensor, Tensor)>,
}

impl AdamW {
    pub fn new(config: AdamWConfig, params: &[(String, Tensor)]) -> AdamW {
        let moments = params
            .iter()
            .map(|(_, p)| (p.zeros_like(), p.zeros_like()))
            .collect();
        AdamW {
            config,
            steps: 0,
            moments,
        }
    }

    /// One update of every parameter from its gradient.
    pub fn step(&mut self, params: &[(String, Tensor)]) {
        let AdamWConfig {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.config;
        self.steps += 1;
        let correction1 = 1.0 - beta1.powi(self.steps as i32);
        let correction2 = 1.0 - beta2.powi(self.steps as i32);
        tch::no_grad(|| {
            for ((_, param), (m, v)) in params.iter().zip(&mut self.moments) {
                let grad = param.grad();
                if !grad.defined() {
                    continue;
                }
                let _ = m.g_mul_scalar_(beta1).g_add_(&(&grad * (1.0 - beta1)));
                let _ = v
                    .g_mul_scalar_(beta2)
                    .g_add_(&(&grad * &grad * (1.0 - beta2)));
                let denominator = (v.sqrt() / correction2.sqrt()) + eps;
                let mut param = param.shallow_clone();
                let _ = param.g_mul_scalar_(1.0 - lr * weight_decay);
                let _ = param.g_sub_(&(&*m / &denominator * (lr / correction1)));
            }
        });
    }

    /// The moments as named tensors, for a checkpoint.
    pub fn state(&self, params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
        let mut state = Vec::with_capacity(2 * params.len());
        for ((name, _), (m, v)) in params.iter().zip(&self.moments) {
            state.push((format!("m.{name}"), m.shallow_clone()));
            state.push((format!("v.{name}"), v.shallow_clone()));
        }
        state
    }

    /// Restores the moments saved by `state`.
    pub fn load_state(
        &mut self,
        params: &[(String, Tensor)],
        saved: &[(String, Tensor)],
        steps: i64,
    ) -> Result<(), String> {
        let find = |key: String| {
            saved
                .iter()
                .find(|(name, _)| *name == key)
                .map(|(_, t)| t)
                .ok_or(format!("optimizer state lacks {key}"))
        };
        for ((name, param), (m, v)) in params.iter().zip(&mut self.moments) {
            for (moment, key) in [(m, format!("m.{name}")), (v, format!("v.{name}"))] {
                let value = find(key.clone())?;
                if value.size() != param.size() {
                    return Err(format!("optimizer state {key} has the wrong shape"));
                }
                tch::no_grad(|| moment.copy_(&value.to_device(param.device())));
            }
        }
        self.steps = steps;
        Ok(())
    }
}

/// Scales the gradients so their global L2 norm is at most `max_norm`. The factor stays on
/// the device (1 where the norm is within bounds), so the step never waits for the GPU here.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .collect();
        if grads.is_empty() {
            return;
        }
        let squares: Vec<Tensor> = grads
            .iter()
            .map(|g| g.to_kind(Kind::Float).square().sum(Kind::Float))
            .collect();
        let norm = Tensor::stack(&squares, 0).sum(Kind::Float).sqrt();
        let factor = (max_norm / (norm + 1e-6)).clamp_max(1.0);
        for mut grad in grads {
            let _ = grad.g_mul_(&factor);
        }
    })
}

/// Sets every gradient to zero (the step's gradients are dropped, their storage kept).
pub fn zero_grads(params: &[(String, Tensor)]) {
    for (_, param) in params {
        let mut grad = param.grad();
        if grad.defined() {
            let _ = grad.detach_();
            let _ = grad.zero_();
        }
    }
}
