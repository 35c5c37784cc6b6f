//! The share in force for a process: a GPU entry beats a user entry beats the default;
//! a user file may only lower the system's.

use std::fmt;

use super::*;

/// The share in force for a process, and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct FractionInForce {
    pub value: f64,
    /// The file that set it.
    pub source: Source,
    /// The key that set it: `fraction.default`, `fraction.gpu."0"`, `fraction.user.alice`.
    pub key: String,
    /// Set when the user file asked for a higher share than the system file, which is not
    /// allowed: `user /home/alice/.config/gpuctl/gpuctl.toml: fraction.default = 0.95
    /// ignored: a user file may only lower the system's 0.9`.
    pub note: Option<String>,
}

impl FractionInForce {
    /// `system /etc/gpuctl/gpuctl.toml: fraction.gpu."0"`
    pub fn describe(&self) -> String {
        format!("{}: {}", self.source, self.key)
    }
}

impl fmt::Display for FractionInForce {
    /// `0.5 (system /etc/gpuctl/gpuctl.toml: fraction.gpu."0")`, with the note after a `;`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.value, self.describe())?;
        if let Some(note) = &self.note {
            write!(f, "; {note}")?;
        }
        f.write_str(")")
    }
}

impl FractionPolicy {
    /// The share this file sets for a process of `user` on a GPU, and its key. A GPU entry
    /// (by UUID, then by index) beats a user entry, which beats the default.
    pub fn lookup(
        &self,
        gpu_index: u32,
        gpu_uuid: Option<&str>,
        user: Option<&str>,
    ) -> Option<(f64, String)> {
        let gpu_key = |key: &str| format!("fraction.gpu.{}", render_key(key));
        if let Some(uuid) = gpu_uuid
            && let Some((key, value)) = self
                .gpu
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(uuid))
        {
            return Some((*value, gpu_key(key)));
        }
        if let Some((key, value)) = self.gpu.iter().find(|(key, _)| {
            key.chars().all(|c| c.is_ascii_digit()) && key.parse::<u32>() == Ok(gpu_index)
        }) {
            return Some((*value, gpu_key(key)));
        }
        if let Some(user) = user
            && let Some(value) = self.user.get(user)
        {
            return Some((*value, format!("fraction.user.{}", render_key(user))));
        }
        self.default
            .map(|value| (value, "fraction.default".to_string()))
    }
}

/// The share of one GPU's memory a process of `user` may hold on GPU `gpu_index` (UUID
/// `gpu_uuid`), and where it comes from. Within a file, a GPU entry beats a user entry beats
/// the default. Across files, the user file may only lower the system's value: its share is
/// taken when the system sets none or a higher one; a higher one is ignored, and `note`
/// says so. `None`: no limit.
pub fn fraction_for(
    loaded: &Loaded,
    gpu_index: u32,
    gpu_uuid: Option<&str>,
    user: Option<&str>,
) -> Option<FractionInForce> {
    let found = |file: &Option<(Source, Config)>| {
        file.as_ref().and_then(|(source, config)| {
            config
                .fraction
                .lookup(gpu_index, gpu_uuid, user)
                .map(|(value, key)| FractionInForce {
                    value,
                    source: source.clone(),
                    key,
                    note: None,
                })
        })
    };
    match (found(&loaded.system), found(&loaded.user)) {
        (None, None) => None,
        (Some(system), None) => Some(system),
        (None, Some(user)) => Some(user),
        (Some(system), Some(user)) if user.value <= system.value => Some(user),
        (Some(mut system), Some(user)) => {
            system.note = Some(format!(
                "{} = {} ignored: a user file may only lower the system's {}",
                user.describe(),
                user.value,
                system.value
            ));
            Some(system)
        }
    }
}

/// The share for `user`'s processes on one GPU (index and UUID), or with no GPU named: the
/// user or default entry that applies to every GPU. What `gpuctl fraction`, `gpuctl enable`
/// and the Python package's `gpuctl.fraction()` report.
pub fn share_for(
    loaded: &Loaded,
    gpu: Option<(u32, Option<&str>)>,
    user: Option<&str>,
) -> Option<FractionInForce> {
    match gpu {
        Some((index, uuid)) => fraction_for(loaded, index, uuid, user),
        // No GPU index matches u32::MAX, so only user and default entries apply.
        None => fraction_for(loaded, u32::MAX, None, user),
    }
}

/// The name of the user this process runs as, where the user database has it.
pub fn caller_name() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|user| user.name)
}
