//! The change the bench commits: the fleet's GPUs before it, the policy before and after it,
//! and what a node shows once it has converged (see the parent module's docs).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use git2::{Repository, RepositoryInitOptions, Signature};
use tessera_fleet::protocol::Observed;

use super::BenchConvergeArgs;

/// What every GPU starts with: MIG on, one 3g.40gb instance at slice 4.
pub(super) const INITIAL_GPU: &str =
    ", mig: {enabled: true}, instances: [{profile: 3g.40gb, start: 4}]";

/// The geometry the commit asks for, as (profile, first slice), by slice.
const TARGET: [(&str, u8); 2] = [("4g.40gb", 0), ("3g.40gb", 4)];

/// Whether every one of the node's `gpus` GPUs shows [`TARGET`] (see the module's docs).
pub(super) fn shows_target(observed: &Observed, gpus: u32) -> bool {
    observed.node.gpus.len() == gpus as usize
        && observed.node.gpus.iter().all(|gpu| {
            let mut instances: Vec<(&str, u8, bool)> = gpu
                .instances
                .iter()
                .map(|i| (i.profile.as_str(), i.start, i.uuid.is_some()))
                .collect();
            instances.sort_by_key(|i| i.1);
            gpu.mig.enabled
                && gpu.mig.pending.is_none()
                && instances.len() == TARGET.len()
                && instances
                    .iter()
                    .zip(TARGET)
                    .all(|(&(profile, start, made), (p, s))| profile == p && start == s && made)
        })
}

/// The policy: the MIG pool `h100` of every node, its layouts `whole` only, or (`changed`)
/// `whole` and `halves`.
pub(super) fn policy(args: &BenchConvergeArgs, changed: bool) -> String {
    let mut yaml = String::from(
        "# Written by `tessera-fleet bench converge`.\n\
         apiVersion: tessera/v1alpha1\n\
         kind: MigLayout\n\
         metadata: {name: whole}\n\
         spec: {gpuModel: H100-SXM5-80GB, instances: [7g.80gb]}\n",
    );
    if changed {
        yaml.push_str(
            "---\n\
             apiVersion: tessera/v1alpha1\n\
             kind: MigLayout\n\
             metadata: {name: halves}\n\
             spec: {gpuModel: H100-SXM5-80GB, instances: [4g.40gb, 3g.40gb]}\n",
        );
    }
    let _ = write!(
        yaml,
        "---\n\
         apiVersion: tessera/v1alpha1\n\
         kind: Pool\n\
         metadata: {{name: h100}}\n\
         spec:\n  \
           gpuModel: H100-SXM5-80GB\n  \
           capacity: {{nodes: {}, gpusPerNode: {}, cpuPerNode: 200, memoryPerNode: 1800Gi}}\n  \
           sharing: mig\n  \
           migLayouts: [{}]\n",
        args.nodes,
        args.gpus,
        if changed { "whole, halves" } else { "whole" }
    );
    yaml
}

/// The policy repository the replicas follow: `policy/fleet.yaml` on `main`.
pub(super) struct PolicyRepo {
    repo: Repository,
}

impl PolicyRepo {
    pub(super) fn init(dir: &Path) -> anyhow::Result<PolicyRepo> {
        let repo = Repository::init_opts(dir, RepositoryInitOptions::new().initial_head("main"))
            .with_context(|| format!("cannot make a Git repository in {}", dir.display()))?;
        std::fs::create_dir_all(dir.join("policy"))?;
        Ok(PolicyRepo { repo })
    }

    pub(super) fn path(&self) -> &Path {
        self.repo.workdir().expect("not bare")
    }

    /// Commits `yaml` as `policy/fleet.yaml` on `main`; the commit's id.
    pub(super) fn commit(&self, yaml: &str, message: &str) -> anyhow::Result<String> {
        let file = Path::new("policy/fleet.yaml");
        std::fs::write(self.path().join(file), yaml)?;
        let mut index = self.repo.index()?;
        index.add_path(file)?;
        index.write()?;
        let tree = self.repo.find_tree(index.write_tree()?)?;
        let signature = Signature::now("tessera bench", "bench@example.invalid")?;
        let parent = match self.repo.head() {
            Ok(head) => Some(head.peel_to_commit()?),
            Err(_) => None,
        };
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        let id = self.repo.commit(
            Some("HEAD"),
            &signature,
            &signature,
            message,
            &tree,
            &parents,
        )?;
        Ok(id.to_string())
    }
}
