//! The training loop: a fixed effective batch split into micro-batches (each micro-loss
//! scaled by its share of the batch, so the accumulated gradient is the batch's), and
//! recovery from out-of-memory errors that changes nothing about what is learned: the step's
//! gradients are dropped, the cache emptied, the micro-batch halved, and the same step redone
//! on the same samples.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};

use tch::{Device, Kind, Tensor};

use crate::alloc;
use crate::memory::{Event, Monitor, Reading, Trace, TraceRow, bytes};
use crate::model::{Model, ModelConfig};
use crate::optim::{self, AdamW};

thread_local! {
    /// Set while a micro-step runs: a panic there is libtorch's error (tch panics in its
    /// infallible calls), caught and handled, not a crash to print.
    static IN_MICRO_STEP: Cell<bool> = const { Cell::new(false) };
}

/// Keeps the default panic message for real crashes, silences the caught ones.
pub fn install_panic_hook() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if !IN_MICRO_STEP.with(Cell::get) {
            default(info);
        }
    }));
}

/// Runs `f`, turning a panic (tch's way of raising a libtorch error) into its message.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    IN_MICRO_STEP.with(|flag| flag.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    IN_MICRO_STEP.with(|flag| flag.set(false));
    match result {
        Ok(result) => result,
        Err(payload) => Err(payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "libtorch raised an error".into())),
    }
}

/// Whether a libtorch error is an allocation failure: CUDA's caching allocator, cuBLAS's
/// workspace, or the host allocator.
pub fn is_out_of_memory(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("out of memory")
        || lower.contains("cublas_status_alloc_failed")
        || lower.contains("can't allocate memory")
}

/// The first line of a libtorch message, without tch's wrapping: a panic shows the error's
/// Debug form (`Torch("...")`, newlines escaped), a returned error its Display form.
fn first_line(message: &str) -> String {
    let text = message
        .trim_start_matches("called `Result::unwrap()` on an `Err` value: ")
        .trim_start_matches("Torch(\"")
        .trim_start_matches("Internal torch error: ");
    let end = [text.find('\n'), text.find("\\n")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(text.len());
    text[..end].trim().trim_end_matches("\")").to_string()
}

pub enum StepError {
    OutOfMemory(String),
    Failed(String),
}

pub enum TrainError {
    /// Out of memory at micro-batch 1: nothing left to halve. The message has the figures.
    OutOfMemory(String),
    Failed(String),
}

pub struct Trainer<'a> {
    pub model: &'a Model,
    pub config: ModelConfig,
    pub params: Vec<(String, Tensor)>,
    pub optimizer: AdamW,
    pub device: Device,
    pub cuda_index: Option<usize>,
    pub bf16: bool,
    pub batch_size: u32,
    pub micro_batch: u32,
    pub clip_grad: f64,
    pub inject_oom_above: Option<u32>,
    pub monitor: Monitor<'a>,
    /// The per-micro-step trace, when asked for (the "memory hooks").
    pub trace: Option<Trace>,
    pub oom_recoveries: u64,
}

impl Trainer<'_> {
    pub fn grad_accum(&self) -> u32 {
        self.batch_size.div_ceil(self.micro_batch)
    }

    /// One optimizer step on `samples` (`[batch, length + 1]`, on the host), recovering from
    /// out-of-memory errors. Returns the batch's mean loss.
    pub fn step(
        &mut self,
        step: u64,
        samples: &Tensor,
        log: &mut dyn FnMut(String),
    ) -> Result<f64, TrainError> {
        let loss = loop {
            match self.accumulate(step, samples) {
                Ok(loss) => break loss,
                Err(StepError::Failed(message)) => {
                    return Err(TrainError::Failed(format!("step {step}: {message}")));
                }
                Err(StepError::OutOfMemory(message)) => {
                    // Drop what the failed attempt built: its gradients (outputs were dropped
                    // with the unwound frames), then the cached blocks.
                    optim::zero_grads(&self.params);
                    if self.cuda_index.is_some() {
                        let _ = alloc::empty_cache();
                    }
                    self.record(step, 0, Event::OutOfMemory);
                    let figures = self.monitor.milestone();
                    if self.micro_batch == 1 {
                        return Err(TrainError::OutOfMemory(
                            self.unrecoverable(step, &message, &figures),
                        ));
                    }
                    let from = self.micro_batch;
                    self.micro_batch /= 2;
                    self.oom_recoveries += 1;
                    log(format!(
                        "out of memory at step {step} with micro-batch {from} ({}); memory: \
                         {figures}; redoing the step with micro-batch {} x {} on the same samples",
                        first_line(&message),
                        self.micro_batch,
                        self.grad_accum()
                    ));
                }
            }
        };
        if self.clip_grad > 0.0 {
            optim::clip_grad_norm(&self.params, self.clip_grad);
        }
        self.optimizer.step(&self.params);
        optim::zero_grads(&self.params);
        self.record(step, self.grad_accum(), Event::OptimizerStep);
        Ok(loss)
    }

    /// Forward and backward over the step's micro-batches, gradients accumulating.
    fn accumulate(&mut self, step: u64, samples: &Tensor) -> Result<f64, StepError> {
        let batch = i64::from(self.batch_size);
        let micro = i64::from(self.micro_batch);
        // Summed on the device and read once per step: reading each micro-loss would wait
        // for the GPU after every micro-batch.
        let mut total: Option<Tensor> = None;
        for (index, start) in (0..batch).step_by(micro as usize).enumerate() {
            let size = micro.min(batch - start);
            let share = size as f64 / batch as f64;
            let inject = self.inject_oom_above.filter(|&n| size > i64::from(n));
            let (model, device, bf16) = (self.model, self.device, self.bf16);
            // Readings are taken inside, while the activations are alive (after forward) and
            // once backward has freed them; rows are added after.
            let (monitor, hooks) = (&self.monitor, self.trace.is_some());
            let mut after_forward = None;
            let mut after_backward = None;
            let result = guarded(|| {
                let chunk = samples.narrow(0, start, size).to_device(device);
                // Caught inside autocast's closure so that autocast restores its state on an
                // error too, then raised again for `guarded`.
                let loss = tch::autocast(bf16, || {
                    panic::catch_unwind(AssertUnwindSafe(|| model.loss(&chunk)))
                })
                .unwrap_or_else(|payload| panic::resume_unwind(payload));
                if hooks {
                    after_forward = Some(monitor.read());
                }
                if let Some(limit) = inject {
                    // The testing stand-in for a real OOM, raised where a real one would be
                    // (activations held, backward not yet run) and handled the same way.
                    panic!(
                        "out of memory (injected by --inject-oom-above {limit}: \
                         micro-batch of {size})"
                    );
                }
                (&loss * share).f_backward().map_err(|e| e.to_string())?;
                let value = loss.detach() * share;
                drop(loss);
                if hooks {
                    after_backward = Some(monitor.read());
                }
                Ok(value)
            });
            if let Some(reading) = after_forward {
                self.record_reading(step, index as u32, Event::Forward, reading);
            }
            match result {
                Ok(loss) => {
                    total = Some(match total.take() {
                        Some(sum) => sum + loss,
                        None => loss,
                    });
                }
                Err(message) if is_out_of_memory(&message) => {
                    return Err(StepError::OutOfMemory(message));
                }
                Err(message) => return Err(StepError::Failed(first_line(&message))),
            }
            if let Some(reading) = after_backward {
                self.record_reading(step, index as u32, Event::Backward, reading);
            }
        }
        Ok(total.map_or(0.0, |sum| sum.double_value(&[])))
    }

    fn record(&mut self, step: u64, micro_step: u32, event: Event) {
        if self.trace.is_some() {
            let reading = self.monitor.read();
            self.record_reading(step, micro_step, event, reading);
        }
    }

    fn record_reading(&mut self, step: u64, micro_step: u32, event: Event, reading: Reading) {
        let grad_accum = self.grad_accum();
        let micro_batch = self.micro_batch;
        if let Some(trace) = self.trace.as_mut() {
            trace.rows.push(TraceRow {
                step,
                micro_step,
                grad_accum,
                micro_batch,
                event,
                reading,
            });
        }
    }

    /// The error for an OOM at micro-batch 1: the figures, and what would make it fit.
    fn unrecoverable(&self, step: u64, message: &str, figures: &str) -> String {
        let c = &self.config;
        let element = if self.bf16 { 2 } else { 4 };
        let logits = c.length * c.vocab * element;
        let free = self
            .cuda_index
            .and_then(|d| alloc::memory_info(d).ok())
            .map_or(String::new(), |(free, total)| {
                format!(", {} free of {}", bytes(free as i64), bytes(total as i64))
            });
        let bf16 = if self.bf16 {
            String::new()
        } else {
            "--precision bf16 (halves activations), ".to_string()
        };
        format!(
            "out of memory at step {step} even with micro-batch 1 ({}); memory: {figures}{free}. \
             One sample does not fit: try {bf16}a shorter --max-length (now {}), or a smaller \
             model (--width {}, --layers {}, --vocab-size {}: one sample's logits alone take {}). \
             The last checkpoint is intact.",
            first_line(message),
            c.length,
            c.width,
            c.layers,
            c.vocab,
            bytes(logits)
        )
    }
}

/// What `--micro-batch auto` computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub activation_bytes: u64,
    pub logit_bytes: u64,
    pub per_sample_bytes: u64,
    pub budget_bytes: u64,
    pub micro_batch: u32,
}

/// The largest power-of-two micro-batch (at most the batch) whose activations and logits
/// fit in 80% of `free_bytes` once the gradients (`grad_bytes`) are allocated.
///
/// Per sample and layer, a pre-norm block keeps about 18·width values per token (norm
/// outputs, q/k/v, attention output, the 4·width MLP activation and its GELU input) plus
/// heads·length attention weights per token where attention is not fused. The head's logits
/// take length·vocab values, and the loss keeps a float copy, its log-softmax and gradient.
pub fn estimate_micro_batch(
    config: &ModelConfig,
    bf16: bool,
    batch_size: u32,
    free_bytes: u64,
    grad_bytes: u64,
) -> Estimate {
    let element: u64 = if bf16 { 2 } else { 4 };
    let (length, width, heads, vocab, layers) = (
        config.length as u64,
        config.width as u64,
        config.heads as u64,
        config.vocab as u64,
        config.layers as u64,
    );
    let per_token_layer = 18 * width + 3 * heads * length;
    let embeddings = length * width * 4 * 3;
    let activation_bytes = length * layers * per_token_layer * element + embeddings;
    let logit_bytes = length * vocab * (element + 4 + 4 + 4);
    let per_sample_bytes = activation_bytes + logit_bytes;
    let budget_bytes = (free_bytes as f64 * 0.8) as u64;
    let budget_bytes = budget_bytes.saturating_sub(grad_bytes);
    let fits = (budget_bytes / per_sample_bytes.max(1)).clamp(1, u64::from(batch_size));
    let micro_batch = 1u32 << (63 - fits.leading_zeros());
    Estimate {
        activation_bytes,
        logit_bytes,
        per_sample_bytes,
        budget_bytes,
        micro_batch,
    }
}

/// The sum of every parameter, in float64: equal parameters give equal checksums, and a
/// resumed or recovered run can be compared with an uninterrupted one at a glance.
pub fn param_checksum(params: &[(String, Tensor)]) -> f64 {
    tch::no_grad(|| {
        params
            .iter()
            .map(|(_, p)| p.to_kind(Kind::Double).sum(Kind::Double).double_value(&[]))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        ModelConfig {
            vocab: 32000,
            width: 768,
            layers: 12,
            heads: 12,
            length: 1024,
        }
    }

    #[test]
    fn oom_messages_are_recognised() {
        assert!(is_out_of_memory(
            "Torch(\"CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity"
        ));
        assert!(is_out_of_memory(
            "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"
        ));
        assert!(is_out_of_memory(
            "DefaultCPUAllocator: can't allocate memory: you tried"
        ));
        assert!(!is_out_of_memory(
            "shape '[2, 3]' is invalid for input of size 7"
        ));
    }

    #[test]
    fn the_estimate_counts_logits_and_fits_the_budget() {
        let c = config();
        let e = estimate_micro_batch(&c, false, 64, 80 << 30, 500 << 20);
        // Logits of one GPT-2-sized sample: 1024 x 32000 values, 16 bytes each in all.
        assert_eq!(e.logit_bytes, 1024 * 32000 * 16);
        assert!(e.activation_bytes > 1 << 30, "{e:?}");
        assert!(u64::from(e.micro_batch) * e.per_sample_bytes <= e.budget_bytes);
        assert!(u64::from(e.micro_batch) * 2 * e.per_sample_bytes > e.budget_bytes);
        assert!(e.micro_batch.is_power_of_two());
        // bf16 halves the activations: a larger micro-batch fits.
        let half = estimate_micro_batch(&c, true, 64, 80 << 30, 500 << 20);
        assert!(half.micro_batch >= e.micro_batch);
    }

    #[test]
    fn the_estimate_stays_within_one_and_the_batch() {
        let c = config();
        assert_eq!(
            estimate_micro_batch(&c, false, 64, 1 << 20, 0).micro_batch,
            1
        );
        assert_eq!(
            estimate_micro_batch(&c, false, 8, u64::MAX / 2, 0).micro_batch,
            8
        );
        assert_eq!(
            estimate_micro_batch(&c, false, 12, u64::MAX / 2, 0).micro_batch,
            8
        );
    }

    #[test]
    fn tch_errors_read_as_their_first_line() {
        let panicked = "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. \
                        Tried to allocate 2.00 GiB\\nException raised from malloc\")";
        assert_eq!(
            first_line(panicked),
            "CUDA out of memory. Tried to allocate 2.00 GiB"
        );
        let returned = "Internal torch error: shape mismatch\nException raised from";
        assert_eq!(first_line(returned), "shape mismatch");
        assert_eq!(first_line("plain"), "plain");
    }
}
