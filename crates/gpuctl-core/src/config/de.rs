//! Deserializers that check values as they are read, so that the error carries the
//! value's position (and so its line and key path).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

struct Share(f64);

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Share, D::Error> {
        struct ShareVisitor;
        impl Visitor<'_> for ShareVisitor {
            type Value = Share;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a share in (0, 1]")
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Share, E> {
                super::check_share(value).map(Share).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Share, E> {
                self.visit_f64(value as f64)
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Share, E> {
                self.visit_f64(value as f64)
            }
        }
        deserializer.deserialize_any(ShareVisitor)
    }
}

struct GpuKey(String);

impl<'de> Deserialize<'de> for GpuKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<GpuKey, D::Error> {
        let key = String::deserialize(deserializer)?;
        super::check_gpu_key(&key).map_err(de::Error::custom)?;
        Ok(GpuKey(key))
    }
}

struct XidKey(String);

impl<'de> Deserialize<'de> for XidKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<XidKey, D::Error> {
        let key = String::deserialize(deserializer)?;
        match key.parse::<u32>() {
            Ok(xid) if (1..=999).contains(&xid) && xid.to_string() == key => Ok(XidKey(key)),
            _ => Err(de::Error::custom(format!(
                "'{key}' is not an Xid number (1 to 999, as in \"109\" = \"gpu_reset\")"
            ))),
        }
    }
}

impl PartialEq for XidKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for XidKey {}
impl PartialOrd for XidKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for XidKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

pub(super) fn xid_actions<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, crate::health::Action>, D::Error> {
    let map = BTreeMap::<XidKey, crate::health::Action>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(key, action)| (key.0, action))
        .collect())
}

struct UserKey(String);

impl<'de> Deserialize<'de> for UserKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<UserKey, D::Error> {
        let key = String::deserialize(deserializer)?;
        super::check_user_name(&key).map_err(de::Error::custom)?;
        Ok(UserKey(key))
    }
}

impl PartialEq for GpuKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for GpuKey {}
impl PartialOrd for GpuKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for GpuKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}
impl PartialEq for UserKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for UserKey {}
impl PartialOrd for UserKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for UserKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

struct Name(String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a name (a non-empty string)")
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<Name, E> {
                if value.trim().is_empty() {
                    Err(E::custom("empty name: give a non-empty string"))
                } else {
                    Ok(Name(value.to_string()))
                }
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

pub(super) fn share_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Share::deserialize(d).map(|share| Some(share.0))
}

pub(super) fn gpu_shares<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let map = BTreeMap::<GpuKey, Share>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(key, share)| (key.0, share.0))
        .collect())
}

pub(super) fn user_shares<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let map = BTreeMap::<UserKey, Share>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(key, share)| (key.0, share.0))
        .collect())
}

/// Durations: `"60s"`, `"500ms"`, `"1h 30m"`, or a number of seconds.
pub(super) mod duration {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{self, Deserializer, Visitor};
    use serde::ser::Serializer;

    pub(in super::super) fn serialize<S: Serializer>(
        value: &Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Duration, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration, like \"60s\" or \"500ms\"")
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<Duration, E> {
                crate::units::parse_duration(value).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Duration, E> {
                Duration::try_from_secs_f64(value).map_err(|_| {
                    E::custom(format!("{value} is not a duration (like 10s, 500ms, 2m)"))
                })
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Duration, E> {
                self.visit_f64(value as f64)
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Duration, E> {
                Ok(Duration::from_secs(value))
            }
        }
        d.deserialize_any(DurationVisitor)
    }
}

/// A duration that must be above zero (an interval, a timeout).
pub(super) mod duration_positive {
    use std::time::Duration;

    use serde::de::{self, Deserializer};
    use serde::ser::Serializer;

    pub(in super::super) fn serialize<S: Serializer>(
        value: &Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        super::duration::serialize(value, s)
    }

    pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Duration, D::Error> {
        let value = super::duration::deserialize(d)?;
        if value < Duration::from_millis(10) {
            return Err(de::Error::custom(format!(
                "{} is too short: give at least 10ms",
                humantime::format_duration(value)
            )));
        }
        Ok(value)
    }
}

pub(super) fn names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<Name>::deserialize(d)?;
    Ok(names.into_iter().map(|name| name.0).collect())
}

/// An optional duration of at least 10 ms (a key that may be absent).
pub(super) fn duration_positive_opt<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::time::Duration>, D::Error> {
    duration_positive::deserialize(d).map(Some)
}

pub(super) fn serialize_duration_opt<S: serde::Serializer>(
    value: &Option<std::time::Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => duration::serialize(value, s),
        None => s.serialize_none(),
    }
}

/// An absolute path (a key that may be absent).
pub(super) fn absolute_path_opt<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::path::PathBuf>, D::Error> {
    let text = String::deserialize(d)?;
    let path = std::path::PathBuf::from(&text);
    if !path.is_absolute() {
        return Err(de::Error::custom(format!(
            "'{text}' is not an absolute path"
        )));
    }
    Ok(Some(path))
}

/// A size: "1GiB", "512MiB", "40G", or a number of bytes (a key that may be absent).
pub(super) fn size_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct SizeVisitor;
    impl Visitor<'_> for SizeVisitor {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a size like \"1GiB\" or a number of bytes")
        }
        fn visit_str<E: de::Error>(self, value: &str) -> Result<u64, E> {
            crate::units::parse_size(value).map_err(E::custom)
        }
        fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
            Ok(value)
        }
        fn visit_i64<E: de::Error>(self, value: i64) -> Result<u64, E> {
            u64::try_from(value).map_err(|_| E::custom(format!("{value} is not a size")))
        }
    }
    d.deserialize_any(SizeVisitor).map(Some)
}

/// A share in (0, 1] (a key with a default).
pub(super) fn share<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Share::deserialize(d).map(|share| share.0)
}

/// A percentage, 0 to 100.
pub(super) fn percent<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let value = i64::deserialize(d)?;
    u32::try_from(value)
        .ok()
        .filter(|pct| *pct <= 100)
        .ok_or_else(|| de::Error::custom(format!("{value} is not a percentage from 0 to 100")))
}

/// A count of at least 1.
pub(super) fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let value = i64::deserialize(d)?;
    usize::try_from(value)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| de::Error::custom(format!("{value} is not an integer of at least 1")))
}

/// A size: "1GiB", "512MiB", or a number of bytes (a key with a default).
pub(super) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    size_opt(d).map(|size| size.unwrap_or(0))
}

/// A percentage, 1 to 100 (a threshold that 0 would make meaningless).
pub(super) fn percent_positive<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let value = i64::deserialize(d)?;
    u32::try_from(value)
        .ok()
        .filter(|pct| (1..=100).contains(pct))
        .ok_or_else(|| de::Error::custom(format!("{value} is not a percentage from 1 to 100")))
}

/// A command: an absolute path, then its arguments, none of them empty.
pub(super) fn command<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let words = Vec::<String>::deserialize(d)?;
    if let Some(program) = words.first()
        && !program.starts_with('/')
    {
        return Err(de::Error::custom(format!(
            "'{program}' is not an absolute path: give the command's full path first"
        )));
    }
    if words.iter().any(|w| w.is_empty() || w.contains('\0')) {
        return Err(de::Error::custom("a command's words must not be empty"));
    }
    Ok(words)
}

/// Owner selectors (`unit:vllm.service`, `slurm:123`, ...), each checked.
/// `[protect] owners`: pod forms only (`pod:NAMESPACE/NAME`, `namespace:NAME`, `pod:UID`).
pub(super) fn pod_owners<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use crate::owner::OwnerMatch;
    let words = owners(d)?;
    for word in &words {
        if !matches!(
            word.parse::<OwnerMatch>(),
            Ok(OwnerMatch::Pod(_) | OwnerMatch::PodName { .. } | OwnerMatch::Namespace(_))
        ) {
            return Err(de::Error::custom(format!(
                "'{word}' is not a pod: give pod:NAMESPACE/NAME, namespace:NAME or pod:UID"
            )));
        }
    }
    Ok(words)
}

pub(super) fn owners<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let words = Vec::<String>::deserialize(d)?;
    for word in &words {
        word.parse::<crate::owner::OwnerMatch>()
            .map_err(de::Error::custom)?;
    }
    Ok(words)
}
