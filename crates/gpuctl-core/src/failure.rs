//! The exit status an error documents, in one place for every binary and the Python
//! package: core's own kinds, and the lease, pick and run-file errors, wherever they are
//! found in a chain of causes.

use crate::config::ConfigError;
use crate::error::{CoreError, config_exit};
use crate::exit::Exit;
use crate::lease::LeaseError;
use crate::pick::PickError;
use crate::runfile::RunError;

/// The first error of a documented kind in `error`'s chain of causes decides; anything
/// else is a failed operation.
pub fn exit_of(error: &(dyn std::error::Error + 'static)) -> Exit {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(exit) = documented(error) {
            return exit;
        }
        cause = error.source();
    }
    Exit::Failed
}

fn documented(error: &(dyn std::error::Error + 'static)) -> Option<Exit> {
    if let Some(core) = error.downcast_ref::<CoreError>() {
        return Some(core.exit());
    }
    if let Some(config) = error.downcast_ref::<ConfigError>() {
        return Some(config_exit(config));
    }
    if let Some(pick) = error.downcast_ref::<PickError>() {
        return Some(pick.exit());
    }
    if let Some(lease) = error.downcast_ref::<LeaseError>() {
        return Some(lease.exit());
    }
    error.downcast_ref::<RunError>().map(RunError::exit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_documented_exit_through_any_wrapping() {
        let unavailable = CoreError::NvmlUnavailable {
            library: "libnvidia-ml.so.1".into(),
            reason: "not found".into(),
            hint: "",
        };
        assert_eq!(exit_of(&unavailable), Exit::Unavailable);
        assert_eq!(exit_of(&CoreError::Usage("x".into())), Exit::Usage);
        assert_eq!(exit_of(&CoreError::GpuSelector("x".into())), Exit::Usage);
        let config = ConfigError::Value("bad".into());
        assert_eq!(exit_of(&config), Exit::Usage);
        assert_eq!(exit_of(&CoreError::from(config)), Exit::Usage);
        let io = std::io::Error::other("disk");
        assert_eq!(exit_of(&io), Exit::Failed);
        // Found as the cause of another error (as anyhow's context wraps it).
        #[derive(Debug, thiserror::Error)]
        #[error("while doing it")]
        struct Context(#[source] CoreError);
        assert_eq!(exit_of(&Context(CoreError::Usage("y".into()))), Exit::Usage);
    }

    #[test]
    fn the_lease_pick_and_run_roads_have_theirs_too() {
        assert_eq!(exit_of(&PickError::TooFew("1 of 2".into())), Exit::NotClean);
        let core = PickError::Core(CoreError::GpuSelector("no GPU matches '9'".into()));
        assert_eq!(exit_of(&core), Exit::Usage);
        let lease = LeaseError::Unsafe("planted".into());
        assert_eq!(exit_of(&lease), Exit::Failed);
        assert_eq!(exit_of(&PickError::Lease(lease)), Exit::Failed);
        assert_eq!(exit_of(&RunError::BadName("a/b".into())), Exit::Usage);
        let busy = RunError::Unsafe("not yours".into());
        assert_eq!(exit_of(&busy), Exit::Failed);
    }
}
