//! Memory-efficient allocator settings for PyTorch, JAX and TensorFlow, as environment
//! variables (`gpuctl enable`), and applying them to the current process (the in-process API).
//!
//! The user's own choices win: a variable already set is kept, and for PyTorch's allocator
//! configuration (`key:value,key:value`) only missing keys are added.

use serde::Serialize;

/// One variable `enable` sets, or keeps as the user had it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvSetting {
    pub name: &'static str,
    pub value: String,
    /// The value was already in the environment and is kept as it was.
    pub kept: bool,
    pub why: &'static str,
}

/// The two names PyTorch reads its caching allocator's configuration from: the current one
/// (2.9 and later) and the older CUDA-only one that earlier versions read.
const PYTORCH_ALLOC_VARS: [&str; 2] = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"];

/// The settings for a process, given its current environment (`current`) and the memory
/// share policy in force for it (`fraction`).
pub fn enable_env(
    current: &dyn Fn(&str) -> Option<String>,
    fraction: Option<f64>,
) -> Vec<EnvSetting> {
    let mut settings = Vec::new();
    for name in PYTORCH_ALLOC_VARS {
        let existing = current(name).filter(|v| !v.trim().is_empty());
        let (value, kept) =
            merge_alloc_conf(existing.as_deref(), &[("expandable_segments", "True")]);
        settings.push(EnvSetting {
            name,
            value,
            kept,
            why: "PyTorch: expandable segments grow in place instead of leaving fragments",
        });
    }
    let mut plain = |name: &'static str, value: String, why: &'static str| {
        let existing = current(name).filter(|v| !v.is_empty());
        settings.push(EnvSetting {
            name,
            kept: existing.is_some(),
            value: existing.unwrap_or(value),
            why,
        });
    };
    plain(
        "CUDA_MODULE_LOADING",
        "LAZY".into(),
        "CUDA: load kernels when first used, not all at start",
    );
    plain(
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "false".into(),
        "JAX: allocate on demand instead of 75% of the GPU at start",
    );
    if let Some(fraction) = fraction {
        plain(
            "XLA_PYTHON_CLIENT_MEM_FRACTION",
            format_fraction(fraction),
            "JAX: the per-process memory share policy",
        );
    }
    plain(
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "true".into(),
        "TensorFlow: grow GPU memory as needed instead of taking it all",
    );
    settings
}

/// The framework a program uses, for the settings that concern it (the Python package's
/// `gpuctl.enable(framework=...)`): its own variables, and CUDA's, which every framework
/// on a GPU reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    PyTorch,
    Jax,
    TensorFlow,
}

impl Framework {
    pub fn parse(name: &str) -> Result<Framework, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "pytorch" | "torch" => Ok(Framework::PyTorch),
            "jax" => Ok(Framework::Jax),
            "tensorflow" | "tf" => Ok(Framework::TensorFlow),
            _ => Err(format!(
                "unknown framework {name:?}: use \"pytorch\", \"jax\" or \"tensorflow\""
            )),
        }
    }

    /// Whether `setting` concerns a program of this framework.
    pub fn wants(self, setting: &EnvSetting) -> bool {
        let own = match self {
            Framework::PyTorch => "PYTORCH_",
            Framework::Jax => "XLA_",
            Framework::TensorFlow => "TF_",
        };
        setting.name.starts_with(own) || setting.name.starts_with("CUDA_")
    }
}

/// "0.5", "0.75", "1": the shortest form that reads back to the same share.
fn format_fraction(fraction: f64) -> String {
    let text = format!("{fraction:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Adds each `(key, value)` to a PyTorch allocator configuration unless the user's value
/// already has that key. Returns the merged value and whether it is unchanged.
pub fn merge_alloc_conf(existing: Option<&str>, wanted: &[(&str, &str)]) -> (String, bool) {
    let mut entries: Vec<String> = existing
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_string)
        .collect();
    let has = |entries: &[String], key: &str| {
        entries
            .iter()
            .any(|entry| entry.split(':').next().map(str::trim) == Some(key))
    };
    let mut changed = false;
    for (key, value) in wanted {
        if !has(&entries, key) {
            entries.push(format!("{key}:{value}"));
            changed = true;
        }
    }
    (entries.join(","), existing.is_some() && !changed)
}

/// Shells `enable` prints for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    /// sh, bash, zsh: `export NAME='value'`.
    Posix,
    Fish,
}

/// Lines to `eval` in `shell`, values single-quoted so nothing in them is interpreted.
pub fn shell_exports(settings: &[EnvSetting], shell: Shell) -> String {
    let mut out = String::new();
    for setting in settings {
        let value = match shell {
            Shell::Posix => format!("'{}'", setting.value.replace('\'', r"'\''")),
            Shell::Fish => format!(
                "'{}'",
                setting.value.replace('\\', r"\\").replace('\'', r"\'")
            ),
        };
        match shell {
            Shell::Posix => out.push_str(&format!("export {}={value};\n", setting.name)),
            Shell::Fish => out.push_str(&format!("set -gx {} {value};\n", setting.name)),
        }
    }
    out
}

/// Sets the `enable` variables in this process's environment, for programs that use
/// gpuctl-core in-process. Call it before the framework initialises CUDA, and before other
/// threads start: the environment is process-wide and not thread-safe to change.
///
/// # Safety
/// No other thread may read or write the environment at the same time.
pub unsafe fn apply_to_current_process(fraction: Option<f64>) -> Vec<EnvSetting> {
    let settings = enable_env(&|name| std::env::var(name).ok(), fraction);
    for setting in settings.iter().filter(|s| !s.kept) {
        // SAFETY: the caller guarantees no concurrent access to the environment.
        unsafe { std::env::set_var(setting.name, &setting.value) };
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framework_gets_its_own_settings_and_cudas() {
        let settings = enable_env(&|_| None, Some(0.5));
        let names = |framework: Framework| -> Vec<&str> {
            settings
                .iter()
                .filter(|s| framework.wants(s))
                .map(|s| s.name)
                .collect()
        };
        assert_eq!(
            names(Framework::parse("pytorch").unwrap()),
            [
                "PYTORCH_ALLOC_CONF",
                "PYTORCH_CUDA_ALLOC_CONF",
                "CUDA_MODULE_LOADING"
            ]
        );
        assert!(names(Framework::Jax).contains(&"XLA_PYTHON_CLIENT_MEM_FRACTION"));
        assert_eq!(
            names(Framework::TensorFlow).last(),
            Some(&"TF_FORCE_GPU_ALLOW_GROWTH")
        );
        assert!(Framework::parse("caffe").unwrap_err().contains("\"caffe\""));
    }
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn value<'a>(settings: &'a [EnvSetting], name: &str) -> &'a EnvSetting {
        settings.iter().find(|s| s.name == name).unwrap()
    }

    #[test]
    fn fresh_environment_gets_every_setting() {
        let settings = enable_env(&env(&[]), Some(0.5));
        assert_eq!(
            value(&settings, "PYTORCH_ALLOC_CONF").value,
            "expandable_segments:True"
        );
        assert_eq!(
            value(&settings, "PYTORCH_CUDA_ALLOC_CONF").value,
            "expandable_segments:True"
        );
        assert_eq!(value(&settings, "CUDA_MODULE_LOADING").value, "LAZY");
        assert_eq!(
            value(&settings, "XLA_PYTHON_CLIENT_PREALLOCATE").value,
            "false"
        );
        assert_eq!(
            value(&settings, "XLA_PYTHON_CLIENT_MEM_FRACTION").value,
            "0.5"
        );
        assert_eq!(value(&settings, "TF_FORCE_GPU_ALLOW_GROWTH").value, "true");
        assert!(settings.iter().all(|s| !s.kept));
    }

    #[test]
    fn the_users_keys_and_values_win() {
        let settings = enable_env(
            &env(&[
                (
                    "PYTORCH_CUDA_ALLOC_CONF",
                    "max_split_size_mb:128, garbage_collection_threshold:0.6",
                ),
                ("PYTORCH_ALLOC_CONF", "expandable_segments:False"),
                ("XLA_PYTHON_CLIENT_MEM_FRACTION", ".3"),
                ("CUDA_MODULE_LOADING", "EAGER"),
            ]),
            Some(0.9),
        );
        let torch = value(&settings, "PYTORCH_CUDA_ALLOC_CONF");
        assert_eq!(
            torch.value,
            "max_split_size_mb:128,garbage_collection_threshold:0.6,expandable_segments:True"
        );
        assert!(!torch.kept);
        // An explicit choice about the same key is the user's to make.
        let newer = value(&settings, "PYTORCH_ALLOC_CONF");
        assert_eq!(newer.value, "expandable_segments:False");
        assert!(newer.kept);
        assert_eq!(
            value(&settings, "XLA_PYTHON_CLIENT_MEM_FRACTION").value,
            ".3"
        );
        assert_eq!(value(&settings, "CUDA_MODULE_LOADING").value, "EAGER");
        assert!(value(&settings, "CUDA_MODULE_LOADING").kept);
    }

    #[test]
    fn no_policy_no_jax_fraction() {
        let settings = enable_env(&env(&[]), None);
        assert!(
            settings
                .iter()
                .all(|s| s.name != "XLA_PYTHON_CLIENT_MEM_FRACTION")
        );
        assert_eq!(format_fraction(0.75), "0.75");
        assert_eq!(format_fraction(1.0), "1");
        assert_eq!(format_fraction(0.33333), "0.3333");
    }

    #[test]
    fn exports_quote_everything() {
        let settings = vec![EnvSetting {
            name: "X",
            value: "a'b $HOME `x`".into(),
            kept: false,
            why: "",
        }];
        assert_eq!(
            shell_exports(&settings, Shell::Posix),
            "export X='a'\\''b $HOME `x`';\n"
        );
        assert_eq!(
            shell_exports(&settings, Shell::Fish),
            "set -gx X 'a\\'b $HOME `x`';\n"
        );
    }
}
