//! Data-loader worker processes, as PyTorch's DataLoader runs them: worker `w` of `n`
//! prepares the batches of steps `w, w + n, ...` and sends them back over a pipe; the main
//! process takes them in step order. The pipe's buffer is the prefetch queue.
//!
//! A worker is this same binary started with `__data-worker`. It ends when its parent dies
//! (PR_SET_PDEATHSIG, and a check that the parent it was started by is still its parent) or
//! when the pipe is closed, so a crash leaves no worker feeding nobody.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, Stdio};

use crate::data::{DataSpec, EpochOrder};

/// The first argument that makes this binary a worker.
pub const WORKER_ARG: &str = "__data-worker";

/// A batch as it crosses the pipe: the step it belongs to, then its tokens.
const HEADER_BYTES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("could not start data-loader worker {index}: {source}")]
    Spawn { index: usize, source: io::Error },
    #[error(
        "data-loader worker {index} (pid {pid}) stopped sending batches ({reason}); \
         see its message above"
    )]
    WorkerDied {
        index: usize,
        pid: u32,
        reason: String,
    },
    #[error("data-loader worker {index} sent step {got}, expected step {expected}")]
    OutOfOrder {
        index: usize,
        got: u64,
        expected: u64,
    },
}

struct Worker {
    child: Child,
    reader: BufReader<ChildStdout>,
}

/// Where batches come from: worker processes, or this process when there are none.
pub struct Loader {
    spec: DataSpec,
    /// Worker `w` prepares steps `first_step + w`, `first_step + w + n`, ...
    first_step: u64,
    workers: Vec<Worker>,
    /// Used when there are no workers (`--workers 0`).
    order: EpochOrder,
}

impl Loader {
    /// Starts `workers` workers that prepare the batches of steps `first_step..end_step`.
    pub fn start(
        spec: DataSpec,
        workers: usize,
        first_step: u64,
        end_step: u64,
    ) -> Result<Loader, LoaderError> {
        let exe =
            std::env::current_exe().map_err(|source| LoaderError::Spawn { index: 0, source })?;
        let parent = std::process::id();
        let mut started = Vec::with_capacity(workers);
        for index in 0..workers {
            let mut command = Command::new(&exe);
            command
                .arg(WORKER_ARG)
                .args([
                    index.to_string(),
                    workers.to_string(),
                    first_step.to_string(),
                    end_step.to_string(),
                    parent.to_string(),
                    spec.seed.to_string(),
                    spec.vocab.to_string(),
                    spec.length.to_string(),
                    spec.dataset_size.to_string(),
                    spec.batch_size.to_string(),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            // SAFETY: prctl and sigaction (signal) are async-signal-safe; nothing else runs
            // between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // Ctrl-C reaches the whole foreground process group: the trainer stops
                    // after its step, then ends the workers; a worker dying first would only
                    // turn that into an error. An ignored signal stays ignored across exec,
                    // so this holds from the worker's first instruction.
                    libc::signal(libc::SIGINT, libc::SIG_IGN);
                    Ok(())
                });
            }
            let mut child = command
                .spawn()
                .map_err(|source| LoaderError::Spawn { index, source })?;
            let stdout = child.stdout.take().expect("stdout is piped");
            started.push(Worker {
                child,
                reader: BufReader::with_capacity(1 << 20, stdout),
            });
        }
        Ok(Loader {
            spec,
            first_step,
            workers: started,
            order: EpochOrder::default(),
        })
    }

    /// The workers' pids, for the run file.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.child.id()).collect()
    }

    /// The tokens of step `step`'s batch (`batch_size` rows of `length + 1`).
    pub fn batch(&mut self, step: u64) -> Result<Vec<u32>, LoaderError> {
        if self.workers.is_empty() {
            return Ok(self.spec.batch(step, &mut self.order));
        }
        let index = ((step - self.first_step) % self.workers.len() as u64) as usize;
        let worker = &mut self.workers[index];
        let died = |worker: &mut Worker, reason: String| {
            let status = worker.child.try_wait().ok().flatten();
            LoaderError::WorkerDied {
                index,
                pid: worker.child.id(),
                reason: status.map_or(reason, |s| s.to_string()),
            }
        };
        let mut header = [0u8; HEADER_BYTES];
        if let Err(e) = worker.reader.read_exact(&mut header) {
            return Err(died(worker, e.to_string()));
        }
        let got = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let count = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) as usize;
        if got != step {
            return Err(LoaderError::OutOfOrder {
                index,
                got,
                expected: step,
            });
        }
        let mut bytes = vec![0u8; count * 4];
        if let Err(e) = worker.reader.read_exact(&mut bytes) {
            return Err(died(worker, e.to_string()));
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the pipes ends the workers (their next write fails); wait so none is left
        // as a zombie while this process goes on.
        for worker in &mut self.workers {
            let _ = worker.child.kill();
        }
        for worker in &mut self.workers {
            let _ = worker.child.wait();
        }
    }
}

/// A worker's life: `args` are what `Loader::start` passed after `WORKER_ARG`. Returns the
/// process's exit status.
pub fn worker_main(args: &[String]) -> i32 {
    let numbers: Option<Vec<u64>> = args.iter().map(|a| a.parse::<u64>().ok()).collect();
    let Some(
        [
            index,
            workers,
            first_step,
            end_step,
            parent,
            seed,
            vocab,
            length,
            dataset_size,
            batch_size,
        ],
    ) = numbers.and_then(|n| <[u64; 10]>::try_from(n).ok())
    else {
        eprintln!("gpuctl-trainer: {WORKER_ARG} is internal: started by gpuctl-trainer itself");
        return 2;
    };
    // The parent may have died before PR_SET_PDEATHSIG took effect.
    if u64::from(std::os::unix::process::parent_id()) != parent {
        return 0;
    }
    let spec = DataSpec {
        seed,
        vocab: vocab as u32,
        length: length as u32,
        dataset_size,
        batch_size: batch_size as u32,
    };
    let mut order = EpochOrder::default();
    let mut out = BufWriter::with_capacity(1 << 20, io::stdout().lock());
    let mut step = first_step + index;
    while step < end_step {
        let tokens = spec.batch(step, &mut order);
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(&step.to_le_bytes());
        header[8..12].copy_from_slice(&(tokens.len() as u32).to_le_bytes());
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        // A closed pipe means the trainer is gone or done: not an error of ours.
        if out.write_all(&header).is_err() || out.write_all(&bytes).is_err() || out.flush().is_err()
        {
            return 0;
        }
        step += workers;
    }
    0
}
