//! `ai-sandbox image share IMAGE`: one of the user's images given to one project's sandbox
//! engine (`containers = on`). The engine sees no other image of the user's (the whole store
//! would show every project all of them) and pulls only through the gate; this is how an image
//! that is not to be pulled gets in. The copy is made by the project's own engine, in a short
//! sandbox of the project (`--net none`) that loads what `podman save` writes into its standard
//! input: the image lands exactly as the engine stores images (one id), and nothing is written
//! through a directory the agent could have arranged.

use crate::cli::{PolicyArgs, RunArgs};
use crate::error::hinted;
use crate::host::Host;
use crate::policy::NetMode;
use std::path::{Path, PathBuf};

/// `podman load -q` inside, its stderr printed only when it fails.
const LOAD_QUIETLY: &str =
    "said=$(podman load -q 2>&1 >/dev/null); rc=$?; [ $rc -eq 0 ] || printf '%s\\n' \"$said\" >&2; exit $rc";

pub fn share_cmd(host: &mut dyn Host, image: &str, project: Option<&Path>) -> anyhow::Result<i32> {
    let podman = host.which("podman").unwrap_or_else(|| PathBuf::from("podman"));
    if !host.image_present(&podman, image)? {
        return Err(hinted(
            format!("image share: there is no image `{image}` on this machine; nothing was shared"),
            "`podman images` lists them (ai-sandbox never pulls: `podman pull` it first, or let the sandbox pull it from an allowed registry)",
        )
        .into());
    }
    let finish = host.stdin_from_image(&podman, image)?;
    let args = RunArgs {
        policy: PolicyArgs {
            net: Some(NetMode::None),
            project: project.map(Path::to_path_buf),
            ..PolicyArgs::default()
        },
        containers: true,
        // The engine's own notes on a load that worked (its subordinate ids, its storage) are
        // nothing to act on: said only when the load fails.
        command: ["sh", "-c", LOAD_QUIETLY].iter().map(Into::into).collect(),
        ..RunArgs::default()
    };
    let code = super::app::run(host, &args)?;
    finish()?;
    if code != 0 {
        return Err(hinted(
            format!(
                "image share: the sandbox's engine did not load {image} (exit {code}; its error is above)"
            ),
            "run `ai-sandbox --containers -- podman info` to see the engine's state",
        )
        .into());
    }
    host.eprint(&format!(
        "ai-sandbox: {image} is in this project's sandbox engine now (`podman images` inside lists it)\n"
    ));
    Ok(0)
}
