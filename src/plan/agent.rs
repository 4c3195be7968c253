//! Running an agent wherever the user installed it (pure). Only the host's /usr, /etc and /opt
//! are visible inside (and the project, and a sandbox HOME that is not the real one), so a CLI
//! installed per user — Claude Code's native installer under ~/.local, a user npm prefix, nvm,
//! ~/.cargo/bin, pipx — is not found inside. The launcher resolves the command on the host's
//! PATH (facts), and this module decides what to mount read-only at the same path (the install
//! tree of the resolved target, never all of HOME), what to execute, and which directory the
//! sandbox's PATH needs for the script's interpreter (`#!/usr/bin/env node` from nvm, say).

use std::path::{Path, PathBuf};

/// What the host knows about a command name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Where PATH found it (`~/.local/bin/claude`).
    pub(crate) path: PathBuf,
    /// Its real path, links resolved.
    pub(crate) target: PathBuf,
    /// The interpreter its `#!` line names, resolved the same way (`env node` → node's target).
    pub(crate) interpreter: Option<(PathBuf, PathBuf)>,
}

/// How to run it inside.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Launchable {
    /// The program to execute inside (the real path), when it is not visible as is.
    pub(crate) program: Option<String>,
    /// Directories to mount read-only at the same path.
    pub(crate) mounts: Vec<PathBuf>,
    /// A directory to put first on the sandbox's PATH (the interpreter's).
    pub(crate) path_prefix: Option<PathBuf>,
    /// What to tell the user.
    pub(crate) notice: Option<String>,
    /// Why the sandbox cannot run it at all (nothing starts; exit 127).
    pub(crate) unreachable: Option<String>,
}

/// Directories visible inside as they are on the host.
fn visible(p: &Path, visible_dirs: &[PathBuf]) -> bool {
    visible_dirs.iter().any(|d| p.starts_with(d))
}

/// The tree a program needs: an npm-style prefix (`PREFIX/lib/node_modules/...`: the prefix,
/// which holds the package and, for nvm, node itself); a `bin` directory's parent (a venv, a
/// cargo or pipx home, a versioned install); else the program's directory.
pub(crate) fn install_root(target: &Path) -> PathBuf {
    let comps: Vec<_> = target.components().collect();
    if let Some(i) =
        comps.windows(2).position(|w| w[0].as_os_str() == "lib" && w[1].as_os_str() == "node_modules")
    {
        return comps[..i].iter().collect();
    }
    let dir = target.parent().unwrap_or(Path::new("/"));
    if dir.file_name().is_some_and(|n| n == "bin") {
        return dir.parent().unwrap_or(dir).to_path_buf();
    }
    dir.to_path_buf()
}

/// An install root directly under HOME (`~/.local`, `~/.cargo`, `~/.npm-global`) also holds
/// other things (`~/.cargo/credentials.toml`, keyrings under `~/.local/share`): only its `bin`,
/// the top-level directory that holds the program itself (`lib` for a native binary an npm
/// package ships, as Claude Code's does), and for a script `lib`, are mounted.
fn narrow(root: PathBuf, home: &Path, target: &Path, script: bool) -> Vec<PathBuf> {
    if root.parent() != Some(home) {
        return vec![root];
    }
    let mut v = vec![root.join("bin")];
    let holder = target.strip_prefix(&root).ok().and_then(|rel| rel.components().next());
    if let Some(first) = holder.filter(|_| target.parent() != Some(&root)) {
        v.push(root.join(first));
    }
    if script {
        v.push(root.join("lib"));
    }
    v.sort();
    v.dedup();
    v
}

/// Decides how to run a command found on the host. `home` is the user's real HOME: mounting it,
/// or anything that contains it, would expose keys and dotfiles, so that is refused with a note.
pub(crate) fn plan(name: &str, found: Option<&Found>, visible_dirs: &[PathBuf], home: &Path) -> Launchable {
    let Some(f) = found else {
        return Launchable {
            notice: Some(format!(
                "`{name}` is not on this host's PATH; the sandbox looks for it in /usr, /opt and the project only"
            )),
            ..Launchable::default()
        };
    };
    if visible(&f.target, visible_dirs)
        && f.interpreter.as_ref().is_none_or(|(_, t)| visible(t, visible_dirs))
    {
        return Launchable::default();
    }
    let mut out = Launchable { program: Some(f.target.display().to_string()), ..Launchable::default() };
    let script = f.interpreter.is_some();
    let mut roots = narrow(install_root(&f.target), home, &f.target, script);
    if let Some((ipath, itarget)) = &f.interpreter
        && !visible(itarget, visible_dirs)
    {
        roots.extend(narrow(install_root(itarget), home, itarget, true));
        out.path_prefix = ipath.parent().map(Path::to_path_buf);
    }
    for r in roots {
        if visible(&r, visible_dirs) || out.mounts.iter().any(|m| r.starts_with(m)) {
            continue;
        }
        if home.starts_with(&r) || r.parent().is_none() {
            return Launchable {
                unreachable: Some(format!(
                    "`{name}` is {} on this host, and the sandbox could see it only by mounting {}, which holds your \
                     home directory: command not found inside. To make it available, install it in a directory of \
                     its own (~/.local/bin, /usr/local/bin, /opt/NAME) or copy it into the project",
                    f.target.display(),
                    r.display()
                )),
                ..Launchable::default()
            };
        }
        out.mounts.push(r);
    }
    let shown: Vec<String> = out.mounts.iter().map(|m| m.display().to_string()).collect();
    out.notice = Some(format!(
        "`{name}` is {} on this host; mounted read-only inside: {}",
        f.target.display(),
        shown.join(", ")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vis() -> Vec<PathBuf> {
        ["/usr", "/etc", "/opt", "/w/project"].iter().map(PathBuf::from).collect()
    }
    fn found(path: &str, target: &str, interp: Option<(&str, &str)>) -> Found {
        Found {
            path: path.into(),
            target: target.into(),
            interpreter: interp.map(|(a, b)| (PathBuf::from(a), PathBuf::from(b))),
        }
    }
    const HOME: &str = "/home/u";

    #[test]
    fn system_installs_need_nothing() {
        let f = found(
            "/usr/bin/claude",
            "/usr/lib/node_modules/x/cli.js",
            Some(("/usr/bin/node", "/usr/bin/node")),
        );
        assert_eq!(plan("claude", Some(&f), &vis(), Path::new(HOME)), Launchable::default());
    }

    #[test]
    fn a_native_install_under_local_share_is_mounted_alone() {
        let f = found("/home/u/.local/bin/claude", "/home/u/.local/share/claude/versions/2.0.1", None);
        let l = plan("claude", Some(&f), &vis(), Path::new(HOME));
        assert_eq!(l.program.as_deref(), Some("/home/u/.local/share/claude/versions/2.0.1"));
        assert_eq!(l.mounts, [PathBuf::from("/home/u/.local/share/claude/versions")]);
        assert!(l.path_prefix.is_none());
    }

    #[test]
    fn an_nvm_package_brings_its_node_in_one_mount() {
        let f = found(
            "/home/u/.nvm/versions/node/v20.1.0/bin/codex",
            "/home/u/.nvm/versions/node/v20.1.0/lib/node_modules/@openai/codex/bin/codex.js",
            Some((
                "/home/u/.nvm/versions/node/v20.1.0/bin/node",
                "/home/u/.nvm/versions/node/v20.1.0/bin/node",
            )),
        );
        let l = plan("codex", Some(&f), &vis(), Path::new(HOME));
        assert_eq!(l.mounts, [PathBuf::from("/home/u/.nvm/versions/node/v20.1.0")]);
        assert_eq!(l.path_prefix, Some(PathBuf::from("/home/u/.nvm/versions/node/v20.1.0/bin")));
        assert!(l.notice.unwrap().contains("mounted read-only"));
    }

    #[test]
    fn a_user_npm_prefix_with_system_node_mounts_its_bin_and_lib_only() {
        let f = found(
            "/home/u/.npm-global/bin/codex",
            "/home/u/.npm-global/lib/node_modules/@openai/codex/bin/codex.js",
            Some(("/usr/bin/node", "/usr/bin/node")),
        );
        let l = plan("codex", Some(&f), &vis(), Path::new(HOME));
        assert_eq!(
            l.mounts,
            [PathBuf::from("/home/u/.npm-global/bin"), PathBuf::from("/home/u/.npm-global/lib")]
        );
        assert!(l.path_prefix.is_none());
    }

    #[test]
    fn a_native_binary_shipped_in_a_user_npm_prefix_mounts_bin_and_lib() {
        // Claude Code's npm package: bin/claude links to a native binary in lib/node_modules.
        let f = found(
            "/home/u/.npm-global/bin/claude",
            "/home/u/.npm-global/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe",
            None,
        );
        let l = plan("claude", Some(&f), &vis(), Path::new(HOME));
        assert_eq!(
            l.mounts,
            [PathBuf::from("/home/u/.npm-global/bin"), PathBuf::from("/home/u/.npm-global/lib")]
        );
    }

    #[test]
    fn a_cargo_install_never_brings_the_registry_token() {
        let f = found("/home/u/.cargo/bin/tool", "/home/u/.cargo/bin/tool", None);
        let l = plan("tool", Some(&f), &vis(), Path::new(HOME));
        assert_eq!(l.mounts, [PathBuf::from("/home/u/.cargo/bin")], "not ~/.cargo (credentials.toml)");
    }

    #[test]
    fn home_itself_is_never_mounted_and_a_missing_command_is_said() {
        let f = found("/home/u/claude", "/home/u/claude", None);
        let l = plan("claude", Some(&f), &vis(), Path::new(HOME));
        assert!(l.mounts.is_empty() && l.program.is_none());
        let why = l.unreachable.unwrap();
        assert!(
            why.contains("holds your home directory: command not found") && why.contains("~/.local/bin"),
            "{why}"
        );
        // ~/bin is a `bin` directly under HOME: its install root would be HOME itself.
        let l =
            plan("tool", Some(&found("/home/u/bin/tool", "/home/u/bin/tool", None)), &vis(), Path::new(HOME));
        assert!(l.mounts.is_empty() && l.unreachable.is_some(), "{l:?}");
        let l = plan("nosuch", None, &vis(), Path::new(HOME));
        assert!(l.notice.unwrap().contains("not on this host's PATH"));
    }
}
