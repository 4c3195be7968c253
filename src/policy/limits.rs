//! What one sandbox may take of the machine: processes, memory, and the size of its `/tmp`.
//! Without them one fork bomb or `yes > /tmp/x` (a RAM tmpfs) takes the host down with it.
//!
//! `pids` becomes `--pids-limit` where rootless podman has a cgroup of the sandbox's own (v2),
//! which counts that sandbox's processes only; elsewhere (v1) `--ulimit nproc=N:N`, the one limit
//! there is (ADR 0081: under crun, nproc also counted the user's other sandboxes and podman). `memory` needs cgroup v2 (rootless podman ignores it on v1: the plan
//! says so once). `tmp_size` is the size of the `/tmp` tmpfs of `image = host`.
//! Raising any of them is called out at approval (see `keys`); see docs/adr/0053.

/// Processes (threads included) a sandbox may run at once, by default: a parallel build of a
/// large project stays well below it.
pub(crate) const DEFAULT_PIDS: u32 = 4096;
/// The size of the sandbox's `/tmp` (a tmpfs: memory), by default.
pub(crate) const DEFAULT_TMP: u64 = 2 << 30;

/// The limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) pids: u32,
    /// Bytes; None: no limit of ours.
    pub(crate) memory: Option<u64>,
    pub(crate) tmp: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { pids: DEFAULT_PIDS, memory: None, tmp: DEFAULT_TMP }
    }
}

/// `512m`, `4g`, `1048576`: a size in bytes (k, m, g, t: powers of 1024; case and a trailing
/// `b` or `ib` ignored).
pub(crate) fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim().to_ascii_lowercase();
    let v = v.strip_suffix("ib").or_else(|| v.strip_suffix('b')).unwrap_or(&v);
    let (num, shift) = match v.char_indices().last()? {
        (i, 'k') => (&v[..i], 10),
        (i, 'm') => (&v[..i], 20),
        (i, 'g') => (&v[..i], 30),
        (i, 't') => (&v[..i], 40),
        _ => (v, 0),
    };
    let n: u64 = num.trim().parse().ok()?;
    n.checked_mul(1 << shift).filter(|b| *b > 0)
}

/// A size as the docs write it (`2g`, `512m`, else bytes).
pub(crate) fn show_size(b: u64) -> String {
    for (unit, shift) in [("t", 40), ("g", 30), ("m", 20), ("k", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

pub(crate) fn parse_pids(v: &str) -> Option<u32> {
    v.trim().parse().ok().filter(|n| *n >= 16)
}

/// What approving a `pids` line allows beyond the default, if anything.
pub(crate) fn pids_widen(v: &str) -> Option<String> {
    let n = parse_pids(v)?;
    (n > DEFAULT_PIDS).then(|| format!("lets the sandbox run up to {n} processes (default {DEFAULT_PIDS})"))
}

/// What approving a `tmp_size` line allows beyond the default, if anything.
pub(crate) fn tmp_widen(v: &str) -> Option<String> {
    let b = parse_size(v)?;
    (b > DEFAULT_TMP).then(|| {
        format!(
            "lets the sandbox keep {} in /tmp, in memory (default {})",
            show_size(b),
            show_size(DEFAULT_TMP)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_podman_and_tmpfs_write_them() {
        for (v, want) in [
            ("512m", Some(512 << 20)),
            ("4g", Some(4 << 30)),
            ("4G", Some(4 << 30)),
            ("4GiB", Some(4 << 30)),
            ("16mb", Some(16 << 20)),
            ("1048576", Some(1 << 20)),
            ("1t", Some(1 << 40)),
            ("", None),
            ("g", None),
            ("0", None),
            ("-1g", None),
            ("1.5g", None),
            ("99999999999t", None),
        ] {
            assert_eq!(parse_size(v), want, "{v:?}");
        }
        for b in [2 << 30, 512 << 20, 1 << 20, 1000] {
            assert_eq!(parse_size(&show_size(b)), Some(b));
        }
    }

    #[test]
    fn raising_a_limit_is_called_out_and_lowering_it_is_not() {
        assert!(pids_widen("100000").unwrap().contains("100000 processes"));
        assert_eq!(pids_widen("256"), None);
        assert_eq!(pids_widen(&DEFAULT_PIDS.to_string()), None);
        assert!(tmp_widen("8g").unwrap().contains("8g in /tmp"));
        assert_eq!(tmp_widen("64m"), None);
    }
}
