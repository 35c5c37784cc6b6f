//! The stand-ins' users: a scenario names each by name or uid; the launcher, as root, runs
//! the stand-in as that user, and with `--create-users` makes a missing name a system
//! account for the run, removed when the run ends.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nvml_sim::scenario::User;

/// Who a stand-in runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
}

/// The GECOS of an account the launcher made: a later run recognizes one a killed launcher
/// left behind (its pid gone) and takes it over, so it is removed after all.
const COMMENT_PREFIX: &str = "nvml-sim run ";

/// The accounts of a run's users; those the run created are removed on drop (after the
/// stand-ins are stopped: drop this after them).
#[derive(Debug, Default)]
pub struct Users {
    accounts: BTreeMap<String, Account>,
    created: Vec<String>,
    /// Names that exist nowhere and were not created: their stand-ins run as the launcher.
    pub missing: Vec<String>,
}

impl Users {
    /// Looks up (and with `create`, creates) every named user of `wanted`.
    pub fn resolve<'a>(
        wanted: impl Iterator<Item = &'a User>,
        create: bool,
    ) -> Result<Users, String> {
        let mut users = Users::default();
        for user in wanted {
            let User::Name(name) = user else { continue };
            if users.accounts.contains_key(name) || users.missing.contains(name) {
                continue;
            }
            match lookup(name) {
                Some(entry) if create && stale(&entry.comment) => {
                    users.created.push(name.clone());
                    users.accounts.insert(name.clone(), entry.account);
                }
                Some(entry) => {
                    users.accounts.insert(name.clone(), entry.account);
                }
                None if create => {
                    let (account, made) = create_account(name)?;
                    if made {
                        users.created.push(name.clone());
                    }
                    users.accounts.insert(name.clone(), account);
                }
                None => users.missing.push(name.clone()),
            }
        }
        Ok(users)
    }

    /// The account a stand-in of `user` runs as; `None`: as the launcher.
    pub fn account(&self, user: &User) -> Option<Account> {
        match user {
            User::Name(name) => self.accounts.get(name).copied(),
            // A uid needs no account: the primary group is the account's if there is one,
            // else the number itself, as for a user-private group.
            User::Uid(uid) => Some(Account {
                uid: *uid,
                gid: lookup_uid_gid(*uid).unwrap_or(*uid),
            }),
        }
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for name in &self.created {
            // --force: a process of the user a stand-in forked may still be exiting.
            let out = Command::new("userdel")
                .args(["--force", name])
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(out) if out.status.success() || lookup(name).is_none() => {}
                Ok(out) => eprintln!(
                    "nvml-sim: cannot remove the user {name} this run made: {}",
                    one_line(&out.stderr)
                ),
                Err(e) => {
                    eprintln!("nvml-sim: cannot remove the user {name} this run made: userdel: {e}")
                }
            }
        }
    }
}

struct Entry {
    account: Account,
    comment: String,
}

/// The passwd entry of `name`.
fn lookup(name: &str) -> Option<Entry> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16384];
    // SAFETY: passwd is plain data that getpwnam_r fills in, pointing into `buf`.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives the reads of `pwd` below.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return None;
    }
    let comment = if pwd.pw_gecos.is_null() {
        String::new()
    } else {
        // SAFETY: getpwnam_r set pw_gecos to a NUL-terminated string inside `buf`.
        unsafe { CStr::from_ptr(pwd.pw_gecos) }
            .to_string_lossy()
            .into_owned()
    };
    Some(Entry {
        account: Account {
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        },
        comment,
    })
}

/// The primary group of the account with `uid`, if there is one.
fn lookup_uid_gid(uid: u32) -> Option<u32> {
    let mut buf = vec![0u8; 16384];
    // SAFETY: as in `lookup`.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: as in `lookup`.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(pwd.pw_gid)
}

/// An account an earlier launcher made whose launcher is gone (killed before it could
/// remove it).
fn stale(comment: &str) -> bool {
    let Some(pid) = comment
        .strip_prefix(COMMENT_PREFIX)
        .and_then(|p| p.trim().parse::<i32>().ok())
    else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0
        && unsafe { libc::kill(pid, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// `useradd --system` for `name`, with its own group, no home and no login shell. Another
/// run making the same name at the same time is fine (its account is used); a locked
/// /etc/passwd is waited for, a few seconds. Also says whether this call made it.
fn create_account(name: &str) -> Result<(Account, bool), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--comment",
                &format!("{COMMENT_PREFIX}{}", std::process::id()),
                name,
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot create the user {name}: useradd: {e}"))?;
        // useradd(8): 9 the name is taken (by a run beside this one), 10 /etc/passwd is locked.
        let made = match out.status.code() {
            Some(0) => true,
            Some(9) => false,
            Some(10) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            _ => {
                return Err(format!(
                    "cannot create the user {name}: {}",
                    one_line(&out.stderr)
                ));
            }
        };
        return lookup(name)
            .map(|entry| (entry.account, made))
            .ok_or_else(|| format!("cannot create the user {name}: useradd made no account"));
    }
}

fn one_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        "no reason given".into()
    } else {
        text
    }
}
