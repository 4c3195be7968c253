//! The root directory of an `image = host` sandbox: a skeleton made anew for each session, in
//! its private session directory, and mounted read-only (ADR 0055).
//!
//! Why per session: one skeleton shared by every sandbox of a user was owned by that user, so
//! with keep-id the agent inside could replace `/bin` with a link to its own directory, and
//! the next sandbox of another project ran the planted `/bin/sh`. Read-only alone would not do:
//! podman's runtime creates a mount point in the root for every mount whose target is missing
//! (a project at `/srv/x` leaves `srv/x`), as the container's root user, which the user cannot
//! remove, and those stubs pile up. Made per session, nothing outlives the session, nothing is
//! shared, and there is nothing to check before the next use. The cost is a dozen `mkdir`s.
//!
//! The writable places programs expect (`/tmp`, `/var/tmp`) are tmpfs mounts of the session;
//! `/run` and `/dev` are podman's own tmpfs. The parents of every other mount target are made
//! here, as the user, so the runtime adds at most the last component (which the user may
//! remove, since its directory is the user's).

use std::path::{Component, Path, PathBuf};

/// The skeleton's directories (mode 0755; each is a mount point or stays empty).
pub(crate) const DIRS: &[&str] =
    &["usr", "etc", "opt", "home", "tmp", "proc", "dev", "sys", "run", "var", "var/tmp", "root", "mnt"];

/// The merged-/usr links, as on the host.
pub(crate) const LINKS: &[(&str, &str)] =
    &[("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")];

/// Targets below these are on file systems of their own inside (the host's directories, and
/// tmpfs mounts): their mount points are made there, never in the skeleton.
const ELSEWHERE: &[&str] = &["/usr", "/etc", "/opt", "/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp"];

/// What to make before a session: the directory, and the extra directories (relative) in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skeleton {
    pub(crate) dir: PathBuf,
    /// Parents of mount targets that the skeleton's own directories do not hold.
    pub(crate) parents: Vec<PathBuf>,
}

/// The mount targets in a `podman run` argument vector: `-v`/`--volume SRC:DST[:OPTS]`,
/// `--tmpfs DST[:OPTS]` and `--mount ...,dst=DST` (the user's `extra_args` too).
pub(crate) fn targets(argv: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        // `--volume=V` and `-v=V` (podman's flag parser takes both); `A=B` is a value.
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let value = || inline.clone().or_else(|| it.clone().next().cloned());
        let target = match flag {
            "-v" | "--volume" => value().and_then(|v| v.split(':').nth(1).map(String::from)),
            "--tmpfs" => value().and_then(|v| v.split(':').next().map(String::from)),
            "--mount" => value().and_then(|v| {
                csv_fields(&v).into_iter().find_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    matches!(k, "dst" | "destination" | "target").then(|| v.to_string())
                })
            }),
            _ => None,
        };
        if let Some(t) = target.filter(|t| t.starts_with('/')) {
            out.push(PathBuf::from(t));
        }
        if inline.is_none() && matches!(flag, "-v" | "--volume" | "--tmpfs" | "--mount") {
            it.next();
        }
    }
    out
}

/// The fields of a `--mount` value, which podman reads as one CSV record: a field may be quoted
/// (`"src=/a,b"`), with `""` for a quote inside.
fn csv_fields(v: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = v.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The skeleton for a session whose `podman run` has these arguments.
pub(crate) fn skeleton(dir: PathBuf, argv: &[String]) -> Skeleton {
    let targets = targets(argv);
    // A parent at or below another target is in that mount, not in the skeleton.
    let in_a_mount = |p: &Path| {
        ELSEWHERE.iter().map(Path::new).chain(targets.iter().map(PathBuf::as_path)).any(|m| p.starts_with(m))
    };
    let mut parents: Vec<PathBuf> = targets
        .iter()
        .filter_map(|t| t.parent())
        .filter(|p| !in_a_mount(p))
        .filter_map(relative)
        .filter(|p| !p.as_os_str().is_empty() && !DIRS.iter().any(|d| p == Path::new(d)))
        .collect();
    parents.sort();
    parents.dedup();
    Skeleton { dir, parents }
}

/// `/a/b` as `a/b`; None for a path with `..` (never made).
fn relative(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_form_of_mount_target_is_found() {
        let argv = v(&[
            "podman",
            "run",
            "--rm",
            "-v",
            "/p/proj:/srv/proj",
            "--volume=/a:/b/c:ro",
            "-v=/d:/e",
            "--tmpfs",
            "/tmp:rw,size=1g",
            "--tmpfs=/x/y",
            "--mount",
            "type=bind,src=/h,dst=/data/h",
            "--mount=type=tmpfs,target=/scratch",
            "--env",
            "A=-v",
            "-v",
            "relative:rel",
            "--rootfs",
            "/r",
        ]);
        assert_eq!(
            targets(&argv),
            ["/srv/proj", "/b/c", "/e", "/tmp", "/x/y", "/data/h", "/scratch"].map(PathBuf::from).to_vec()
        );
    }

    #[test]
    fn a_mount_of_a_path_with_a_colon_or_a_comma_is_read_as_podman_reads_it() {
        let [flag, value] =
            crate::plan::podman::bind(Path::new("/p/a:b,c\"d"), Path::new("/srv/a:b,c\"d"), true);
        assert_eq!(flag, "--mount");
        assert_eq!(value, r#"type=bind,"src=/p/a:b,c""d","dst=/srv/a:b,c""d",ro"#);
        assert_eq!(targets(&[flag, value]), [PathBuf::from("/srv/a:b,c\"d")]);
        assert_eq!(csv_fields("a,\"b,c\",d"), ["a", "b,c", "d"]);
        let plain = crate::plan::podman::bind(Path::new("/p/x"), Path::new("/p/x"), false);
        assert_eq!(plain, ["-v", "/p/x:/p/x"]);
    }

    #[test]
    fn parents_are_made_only_where_the_skeleton_is_the_file_system() {
        let argv = v(&[
            "-v",
            "/p:/srv/deep/proj",
            "-v",
            "/h:/home/dev",
            "-v",
            "/x:/home/dev/app",
            "-v",
            "/e:/etc/ssh/ssh_config:ro",
            "-v",
            "/s:/run/user/1000/ai-sandbox/sessions/ab/self-check:ro",
            "--tmpfs",
            "/var/tmp:size=1g",
            "-v",
            "/q:/top",
            "-v",
            "/m:/mnt/x",
            "-v",
            "/z:/a/../../etc",
        ]);
        let s = skeleton(PathBuf::from("/rt/sessions/ab/root"), &argv);
        // /home/dev/app's parent is the HOME mount; /etc/ssh and the session dir are elsewhere.
        assert_eq!(s.parents, ["srv/deep"].map(PathBuf::from).to_vec());
        let alone = skeleton(PathBuf::from("/r"), &v(&["-v", "/p:/home/dev/app"]));
        assert_eq!(alone.parents, [PathBuf::from("home/dev")], "no HOME mount: its parent is made");
    }
}
