//! `ai-sandbox export kube`: the project's policy as Kubernetes objects (see `kube`).

use super::app::{approval, in_line_order, load_policy};
use crate::cli::{PolicyArgs, RunArgs};
use crate::error::{Rejected, hinted};
use crate::host::Host;

const NOT_EXPORTED: &str = "nothing was exported";

/// `ai-sandbox export ...`
pub fn export_cmd(host: &mut dyn Host, cmd: &crate::cli::ExportCmd) -> anyhow::Result<i32> {
    let crate::cli::ExportCmd::Kube { policy, namespace, image, gate_image, cilium } = cmd;
    let o = crate::kube::Options {
        namespace: namespace.clone(),
        image: image.clone(),
        gate_image: gate_image.clone(),
        cilium: *cilium,
        placeholders: Vec::new(),
    };
    export_kube(host, policy, o)
}

/// `ai-sandbox export kube`: the approved config (the same validation as a launch) as
/// Kubernetes objects; what has no cluster meaning is refused by line, and nothing is printed.
fn export_kube(host: &mut dyn Host, args: &PolicyArgs, mut o: crate::kube::Options) -> anyhow::Result<i32> {
    let exported = |e: anyhow::Error| match e.downcast::<Rejected>() {
        Ok(r) => Rejected { outcome: NOT_EXPORTED, ..r }.into(),
        Err(e) => e,
    };
    let loaded =
        load_policy(host, &RunArgs { policy: args.clone(), ..RunArgs::default() }).map_err(exported)?;
    if approval(host, &loaded.policy.project, loaded.text.as_deref())?.status.needs_approval() {
        return Err(hinted(
            format!(
                "{} is not approved; an export carries the policy you reviewed, nothing else",
                loaded.display
            ),
            "review and approve it with `ai-sandbox trust`, then export again",
        )
        .into());
    }
    let (cfg, _) = crate::policy::keys::read(loaded.text.as_deref().unwrap_or_default());
    // Made for this export: what the agent's Pod holds instead of each bound secret.
    for s in loaded.policy.secrets.iter().filter(|s| !s.hosts.is_empty()) {
        o.placeholders
            .push((s.name.clone(), format!("{}{}", crate::gate::secrets::PREFIX, host.random_hex(16)?)));
    }
    let text = crate::kube::export(&loaded.policy, &cfg, &o).map_err(|mut diagnostics| {
        in_line_order(&mut diagnostics);
        Rejected { config_path: loaded.display.clone(), diagnostics, outcome: NOT_EXPORTED }
    })?;
    host.print(&text);
    Ok(0)
}
