//! The `[idle]` table: when a process that holds GPU memory counts as idle, and what the
//! watchdog does about it.

use serde::{Deserialize, Serialize};

use super::de;

/// `[idle]`: processes that hold GPU memory and do nothing with it, and what the watchdog
/// does about them: report (the default), notify (a command run once per idle spell), or
/// reclaim (after `reclaim_after`, never an exempt or protected process). Read from the
/// system file (the watchdog's, and what `gpuctl info` shows it with).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdlePolicy {
    /// The window: how long a process must hold `min_memory` with SM under `util_below`.
    #[serde(with = "de::duration_positive")]
    pub after: std::time::Duration,
    /// Memory below this is not worth a finding ("1GiB", or a number of bytes).
    #[serde(deserialize_with = "de::size")]
    pub min_memory: u64,
    /// SM utilization under this percentage (1 to 100) counts as idle.
    #[serde(deserialize_with = "de::percent_positive")]
    pub util_below: u32,
    pub action: IdleAction,
    /// With `action = "notify"`: the command (an absolute path, then its arguments) run once
    /// per idle spell, with the finding in its environment (`GPUCTL_IDLE_*`).
    #[serde(deserialize_with = "de::command")]
    pub notify_command: Vec<String>,
    /// With `action = "reclaim"`: how long a process must have been idle to be ended; at
    /// least `after`.
    #[serde(with = "de::duration_positive")]
    pub reclaim_after: std::time::Duration,
    /// Users whose processes are never ended (still reported).
    #[serde(deserialize_with = "de::names")]
    pub exempt_users: Vec<String>,
    /// Owners whose processes are never ended, as selectors name them (`unit:vllm.service`,
    /// `slurm:123`, `pod:UID`, `container:ID`, `scope:NAME`).
    #[serde(deserialize_with = "de::owners")]
    pub exempt_owners: Vec<String>,
}

impl Default for IdlePolicy {
    fn default() -> IdlePolicy {
        IdlePolicy {
            after: std::time::Duration::from_secs(2 * 3600),
            min_memory: 1 << 30,
            util_below: 1,
            action: IdleAction::Report,
            notify_command: Vec::new(),
            reclaim_after: std::time::Duration::from_secs(8 * 3600),
            exempt_users: Vec::new(),
            exempt_owners: Vec::new(),
        }
    }
}

impl IdlePolicy {
    /// What no one key can say: the keys that go together. One line, naming the key.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.action == IdleAction::Notify && self.notify_command.is_empty() {
            return Err("idle.action = \"notify\" needs idle.notify_command".into());
        }
        if self.action == IdleAction::Reclaim && self.reclaim_after < self.after {
            return Err(format!(
                "idle.reclaim_after ({}) is shorter than idle.after ({}): a process is ended \
                 only after it was found idle",
                humantime::format_duration(self.reclaim_after),
                humantime::format_duration(self.after)
            ));
        }
        Ok(())
    }
}

/// `idle.action`: the ladder, from report to reclaim.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// The finding, its journal event and metrics; nothing else.
    #[default]
    Report,
    /// Also `notify_command`, once per idle spell.
    Notify,
    /// Also end the process through the reclaim road after `reclaim_after`.
    Reclaim,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Report => "report",
            IdleAction::Notify => "notify",
            IdleAction::Reclaim => "reclaim",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::parse;

    #[test]
    fn the_idle_table_reads_every_key_and_checks_each_with_one_line() {
        let path = Path::new("/etc/gpuctl/gpuctl.toml");
        let idle = parse("", path).unwrap().idle;
        assert_eq!(idle, IdlePolicy::default());
        assert_eq!(idle.after, std::time::Duration::from_secs(7200));
        assert_eq!(
            idle.action,
            IdleAction::Report,
            "nothing is ended unless a site asks"
        );
        let full = parse(
            "[idle]\nafter = \"2h\"\nmin_memory = \"1GiB\"\nutil_below = 1\naction = \"reclaim\"\n\
             notify_command = [\"/usr/local/bin/tell-user\", \"--idle\"]\nreclaim_after = \"8h\"\n\
             exempt_users = [\"alice\"]\nexempt_owners = [\"unit:vllm.service\", \"slurm:12\"]\n",
            path,
        )
        .unwrap()
        .idle;
        assert_eq!(full.action, IdleAction::Reclaim);
        assert_eq!(full.min_memory, 1 << 30);
        assert_eq!(full.reclaim_after, std::time::Duration::from_secs(8 * 3600));
        assert_eq!(full.exempt_owners, ["unit:vllm.service", "slurm:12"]);
        for (bad, says) in [
            ("after = \"soon\"", "idle.after"),
            ("after = \"0s\"", "too short"),
            ("min_memory = \"lots\"", "idle.min_memory"),
            ("util_below = 0", "not a percentage from 1 to 100"),
            ("util_below = 101", "not a percentage from 1 to 100"),
            ("action = \"kill\"", "idle.action"),
            ("notify_command = [\"tell-user\"]", "not an absolute path"),
            (
                "notify_command = [\"/bin/tell\", \"\"]",
                "must not be empty",
            ),
            ("exempt_users = [\"\"]", "idle.exempt_users"),
            ("exempt_owners = [\"vllm\"]", "is not an owner"),
            ("idle_after = \"2h\"", "idle_after"),
            ("action = \"notify\"", "needs idle.notify_command"),
            (
                "action = \"reclaim\"\nreclaim_after = \"1h\"",
                "idle.reclaim_after (1h) is shorter than idle.after (2h)",
            ),
        ] {
            let error = parse(&format!("[idle]\n{bad}\n"), path)
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(error.contains("line "), "{bad}: {error}");
            assert!(!error.contains('\n'), "{bad}: {error}");
        }
    }
}
