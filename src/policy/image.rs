//! `image = host | NAME`: the host's own tools on a read-only root made for each session, or a
//! local OCI image named by a reference podman accepts — checked here, so a path (`../../etc`), a flag (`-v`) or an
//! empty name never reaches podman's positional image argument.

use super::{Collector, Image, Inputs};
use crate::config::Config;
use crate::error::Origin;
use crate::policy::keys::Name;

pub(super) fn image(config: &Config, inputs: &Inputs, c: &mut Collector) -> Image {
    let (v, at) = match &inputs.image {
        Some(v) => (v.as_str(), Origin::Flag("--image")),
        None => match config.one(Name::Image) {
            Some(x) => x,
            None => return Image::Host,
        },
    };
    if v == "host" {
        Image::Host
    } else if v.is_empty() {
        c.bad(at, "the image name is empty", "write `host` (the default) or a local image name");
        Image::Host
    } else if !valid_image_reference(v) {
        c.bad(
            at,
            format!("`{v}` is not an image reference"),
            "write `host`, or a local image as podman names it: `NAME[:TAG]`, e.g. `localhost/dev:latest` (lowercase; no paths)",
        );
        Image::Host
    } else {
        Image::Named(v.to_string())
    }
}

/// The OCI image reference grammar (distribution/reference): `[HOST[:PORT]/]PATH[:TAG][@DIGEST]`,
/// path components lowercase `[a-z0-9]+` joined by `.`, `_`, `__` or dashes. Refuses paths
/// (`../../etc`), flags (`-v`), whitespace and empty components.
fn valid_image_reference(v: &str) -> bool {
    let (rest, digest) = match v.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (v, None),
    };
    if let Some(d) = digest {
        let Some((alg, hex)) = d.split_once(':') else { return false };
        if alg.is_empty()
            || !alg.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "+._-".contains(ch))
            || hex.len() < 32
            || !hex.chars().all(|ch| ch.is_ascii_hexdigit())
        {
            return false;
        }
    }
    // A tag follows the last `:` after the last `/` (a `:` before it is a registry port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.chars().next().is_some_and(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            && t.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch));
        if !ok {
            return false;
        }
    }
    let mut comps: Vec<&str> = name.split('/').collect();
    if comps.len() > 1 {
        let first = comps[0];
        let is_host = first.contains('.') || first.contains(':') || first == "localhost";
        if is_host {
            let (host, port) = match first.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (first, None),
            };
            let host_ok = !host.is_empty()
                && host.split('.').all(|l| {
                    !l.is_empty()
                        && l.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                });
            if !host_ok || port.is_some_and(|p| p.is_empty() || !p.chars().all(|ch| ch.is_ascii_digit())) {
                return false;
            }
            comps.remove(0);
        }
    }
    let component_ok = |comp: &str| {
        let b = comp.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && comp.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch))
            && !comp.contains("..")
            && !comp.contains("___")
    };
    !comps.is_empty() && comps.iter().all(|comp| component_ok(comp))
}
