//! `--prune` for `vxds apply` and `vxds diff`, scoped as `kubectl apply --prune` is: it
//! refuses to run without a scope — the types (`--prune-type`), a name prefix
//! (`--prune-prefix`) or an xdstp authority (`--prune-authority`), or `--all` — so that a
//! file of routes never deletes every cluster.

use std::collections::BTreeSet;

use clap::Args;
use vxds_core::xdstp::XdstpUrn;
use vxds_envoy::resource::ResourceType;

use crate::target::Target;

#[derive(Clone, Debug, Default, Args)]
pub struct PruneArgs {
    /// Also delete the resources the fixtures do not mention, within a scope: `--prune-type`,
    /// `--prune-prefix`, `--prune-authority`, or `--all`.
    #[arg(long)]
    pub prune: bool,
    /// With `--prune`: only resources of this type (alias such as `route`, or type URL).
    /// Repeatable.
    #[arg(long = "prune-type", value_name = "TYPE", requires = "prune")]
    pub types: Vec<String>,
    /// With `--prune`: only resources whose name starts with this.
    #[arg(long = "prune-prefix", value_name = "PREFIX", requires = "prune")]
    pub prefix: Option<String>,
    /// With `--prune`: only xdstp resources of this authority.
    #[arg(long = "prune-authority", value_name = "AUTHORITY", requires = "prune")]
    pub authority: Option<String>,
    /// With `--prune`: every resource of every type the fixtures do not mention.
    #[arg(long, requires = "prune", conflicts_with_all = ["types", "prefix", "authority"])]
    pub all: bool,
}

/// What a prune may delete.
#[derive(Debug)]
pub struct Scope {
    /// Type URLs; empty: every type.
    types: BTreeSet<String>,
    prefix: Option<String>,
    authority: Option<String>,
}

impl PruneArgs {
    /// The scope, if pruning; an error naming the flags when `--prune` has none.
    pub fn scope(&self) -> anyhow::Result<Option<Scope>> {
        if !self.prune {
            return Ok(None);
        }
        if !self.all && self.types.is_empty() && self.prefix.is_none() && self.authority.is_none() {
            anyhow::bail!(
                "--prune needs a scope: --prune-type TYPE (repeatable), --prune-prefix PREFIX or \
                 --prune-authority AUTHORITY, or --all to prune every type"
            );
        }
        let types = self
            .types
            .iter()
            .map(|t| {
                ResourceType::resolve(t)
                    .map(|ty| ty.type_url().to_owned())
                    .map_err(|e| anyhow::anyhow!("--prune-type {t}: {e}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Some(Scope {
            types,
            prefix: self.prefix.clone(),
            authority: self.authority.clone(),
        }))
    }
}

impl Scope {
    pub fn covers(&self, type_url: &str, name: &str) -> bool {
        (self.types.is_empty() || self.types.contains(type_url))
            && self.prefix.as_deref().is_none_or(|p| name.starts_with(p))
            && self
                .authority
                .as_deref()
                .is_none_or(|a| XdstpUrn::parse(name).is_ok_and(|urn| urn.authority() == a))
    }

    /// The stored resources in scope that `keep` does not name.
    pub async fn deletions(
        &self,
        target: &Target,
        keep: &BTreeSet<(String, String)>,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let mut listed = Vec::new();
        if self.types.is_empty() {
            listed = target.list_all(None).await?;
        } else {
            for type_url in &self.types {
                listed.extend(target.list_all(Some(type_url)).await?);
            }
        }
        Ok(listed
            .into_iter()
            .filter(|(t, n)| self.covers(t, n) && !keep.contains(&(t.clone(), n.clone())))
            .collect())
    }
}
