//! The job slurmd runs a prolog or epilog for, from the environment it gives them.

use anyhow::Result;
use gpuctl_core::select::OwnerMatch;

use gpuctl_core::CoreError;

/// The job slurmd runs a prolog or epilog for, from the environment it gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    /// As Slurm names them: GPU indices, or UUIDs (GPU-…, MIG-…).
    pub gpus: Vec<String>,
    pub user: Option<String>,
    /// The job's user: SLURM_JOB_UID, which slurmd gives the prolog and epilog, else
    /// SLURM_JOB_USER resolved. Only its processes are the job's to end and account.
    pub uid: Option<u32>,
    pub node: String,
}

impl Job {
    pub fn from_env() -> Result<Job> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let id = var("SLURM_JOB_ID").ok_or_else(|| {
            anyhow::Error::new(CoreError::Usage(
                "SLURM_JOB_ID is not set: run this as slurmd's Prolog or Epilog".into(),
            ))
        })?;
        let Ok(id) = id.parse::<u64>() else {
            return Err(CoreError::Usage(format!("SLURM_JOB_ID '{id}' is not a job id")).into());
        };
        let user = var("SLURM_JOB_USER");
        Ok(Job {
            id,
            gpus: job_gpus(
                var("SLURM_JOB_GPUS").as_deref(),
                var("CUDA_VISIBLE_DEVICES").as_deref(),
            ),
            uid: job_uid(var("SLURM_JOB_UID").as_deref(), user.as_deref()),
            user,
            node: node_name(None),
        })
    }

    /// `slurm:ID`: the job as its cgroups name it, as `--owner` selects it and the watchdog
    /// keys its peaks.
    pub fn owner_key(&self) -> String {
        OwnerMatch::SlurmJob(self.id).to_string()
    }

    /// `slurm:ID@UID`: where the watchdog keeps the peaks of the job's user's processes
    /// that only their environment ties to the job (proctrack/linuxproc). Other users'
    /// claims on the job are kept under their own uid, and never taken.
    pub fn claim_key(&self) -> Option<String> {
        self.uid.map(|uid| {
            OwnerMatch::SlurmClaim {
                job_id: self.id,
                uid,
            }
            .to_string()
        })
    }
}

/// SLURM_JOB_UID, else the uid of SLURM_JOB_USER; `None` when neither tells.
fn job_uid(slurm_job_uid: Option<&str>, user: Option<&str>) -> Option<u32> {
    if let Some(uid) = slurm_job_uid.and_then(|u| u.trim().parse().ok()) {
        return Some(uid);
    }
    let user = user?;
    match nix::unistd::User::from_name(user) {
        Ok(Some(found)) => Some(found.uid.as_raw()),
        _ => None,
    }
}

/// The job's GPUs: SLURM_JOB_GPUS (GRES indices, as gres.conf lists /dev/nvidia0, 1, …),
/// unless CUDA_VISIBLE_DEVICES names MIG instances, which say more (the slice, not the
/// card); CUDA_VISIBLE_DEVICES alone otherwise. "NoDevFiles" and empty entries are none.
fn job_gpus(slurm_job_gpus: Option<&str>, cuda_visible: Option<&str>) -> Vec<String> {
    let split = |text: &str| -> Vec<String> {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "NoDevFiles")
            .map(String::from)
            .collect()
    };
    let visible = cuda_visible.map(split).unwrap_or_default();
    if visible.iter().any(|v| v.starts_with("MIG-")) {
        return visible;
    }
    match slurm_job_gpus.map(split) {
        Some(gpus) if !gpus.is_empty() => gpus,
        _ => visible,
    }
}

/// SLURMD_NODENAME (slurmd's name for this node, which may differ from the host's), else
/// the short host name.
pub fn node_name(given: Option<&str>) -> String {
    if let Some(name) = given {
        return name.to_string();
    }
    if let Some(name) = std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|n| !n.is_empty())
    {
        return name;
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().split('.').next().unwrap_or_default().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobs_uid_is_slurms_else_its_users() {
        assert_eq!(job_uid(Some("1000"), Some("root")), Some(1000));
        assert_eq!(job_uid(None, Some("root")), Some(0));
        assert_eq!(job_uid(Some("x"), Some("root")), Some(0));
        assert_eq!(job_uid(Some("x"), None), None);
        assert_eq!(job_uid(None, Some("no-such-user-gpuctl")), None);
    }

    #[test]
    fn job_gpus_prefers_slurm_and_mig_instances() {
        assert_eq!(job_gpus(Some("0,1"), Some("0,1")), ["0", "1"]);
        assert_eq!(job_gpus(None, Some("2")), ["2"]);
        assert_eq!(job_gpus(Some(""), Some("3")), ["3"]);
        assert_eq!(
            job_gpus(Some("0"), Some("MIG-aaaa-bbbb")),
            ["MIG-aaaa-bbbb"]
        );
        assert!(job_gpus(None, Some("NoDevFiles")).is_empty());
        assert!(job_gpus(None, None).is_empty());
        assert_eq!(job_gpus(Some(" 1 , ,2"), None), ["1", "2"]);
    }
}
