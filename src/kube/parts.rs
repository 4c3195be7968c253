//! The small builders every exported object uses (an environment variable, a mount, the
//! locked-down security context): one place, so the agent's objects (`objects`) and the bound
//! secrets' additions to them (`bound`) share them without importing each other.

use k8s_openapi::api::core::v1::{Capabilities, EnvVar, SeccompProfile, SecurityContext, VolumeMount};

pub(super) fn runtime_default() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), ..SeccompProfile::default() }
}

/// Non-root, no capabilities, no privilege escalation, RuntimeDefault seccomp, read-only root.
pub(super) fn locked_down() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Capabilities::default() }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        seccomp_profile: Some(runtime_default()),
        ..SecurityContext::default()
    }
}

pub(super) fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..EnvVar::default() }
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}
