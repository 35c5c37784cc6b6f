//! A Kubernetes pod by the names people use: its namespace and name, and the container's,
//! as the node's container runtime gives them (the cgroup path carries only the pod's UID),
//! and the selector forms that name pods so: `pod:NAMESPACE/NAME` (globs) and
//! `namespace:NAMESPACE`.

use serde::Serialize;

use super::cgroup::prefix_chars;

/// Longest label of a named pod, in characters: a pod's names are longer than a job number.
pub const POD_LABEL_MAX_CHARS: usize = 64;

/// A pod's names, from the runtime (`PodSandboxMetadata`, `ContainerMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
    /// The container's name, where the process's cgroup names its container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl PodName {
    /// `pod ml/trainer-0 (container trainer)`, `pod ml/notebook-7`; longer ones end in `…`.
    pub fn label(&self) -> String {
        let mut label = format!("pod {}/{}", self.namespace, self.name);
        if let Some(container) = &self.container {
            label.push_str(&format!(" (container {container})"));
        }
        if label.chars().count() <= POD_LABEL_MAX_CHARS {
            return label;
        }
        format!("{}…", prefix_chars(&label, POD_LABEL_MAX_CHARS - 1))
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters and `?` for
/// one (Kubernetes names have neither).
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let (pattern, text): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), text.chars().collect());
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star, at)) => {
                    p = star + 1;
                    t = at + 1;
                    backtrack = Some((star, at + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// Whether `text` is a valid `pod:` or `namespace:` pattern part: a DNS label's characters
/// (lowercase letters, digits, `-`, `.`) and the glob characters.
pub fn is_name_pattern(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.*?".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_the_namespace_pod_and_container() {
        let mut pod = PodName {
            namespace: "ml".into(),
            name: "trainer-0".into(),
            container: Some("trainer".into()),
        };
        assert_eq!(pod.label(), "pod ml/trainer-0 (container trainer)");
        pod.container = None;
        assert_eq!(pod.label(), "pod ml/trainer-0");
        pod.name = "x".repeat(200);
        assert_eq!(pod.label().chars().count(), POD_LABEL_MAX_CHARS);
        assert!(pod.label().ends_with('…'));
    }

    #[test]
    fn globs_match_as_shells_do() {
        for (pattern, text, expected) in [
            ("*", "trainer-0", true),
            ("trainer-*", "trainer-0", true),
            ("trainer-?", "trainer-10", false),
            ("*-0", "trainer-0", true),
            ("t*r*0", "trainer-0", true),
            ("notebook-*", "trainer-0", false),
            ("kube-system", "kube-system", true),
            ("", "", true),
            ("a*", "", false),
        ] {
            assert_eq!(glob_matches(pattern, text), expected, "{pattern} {text}");
        }
    }

    #[test]
    fn name_patterns_are_dns_labels_with_globs() {
        assert!(is_name_pattern("kube-system"));
        assert!(is_name_pattern("trainer-*"));
        assert!(!is_name_pattern("Trainer"));
        assert!(!is_name_pattern(""));
        assert!(!is_name_pattern("a/b"));
    }
}
