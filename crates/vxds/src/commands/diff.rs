//! `vxds diff -f PATH...`: how the resources the fixtures name differ between the server (or
//! a database) and the fixtures, as unified diffs, like `kubectl diff`. Exit 0 when they are
//! equal, 1 when they differ, 2 on any failure (fixtures the rules refuse among them).
//!
//! One diff per variant that differs, headed `server/route/web [env = "prod"]`: a changed body
//! as YAML; a variant only one side has (its constraints are its identity, so new constraint
//! text is one variant gone and one new) with its constraint text; a resource the server
//! lacks as a whole fixture document. Both sides are the canonical forms the server stores
//! (constraint text, proto3 JSON bodies): the fixtures go through the same validation first, so
//! a respelling the server would store identically is no difference. Resources the fixtures
//! do not name are not compared.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use axum::http::Method;
use clap::Args;
use serde_json::{Value, json};
use similar::TextDiff;
use vxds_envoy::changeset::{
    Action, ResourceKey, ValidatedResource, ValidationConfig, validate_standalone,
};
use vxds_envoy::resource::ResourceType;

use crate::fixtures;
use crate::target::{Target, TargetArgs, segment};

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Fixture files or folders.
    #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    target: TargetArgs,
    /// Lines of context around each change.
    #[arg(long, default_value_t = 3)]
    context: usize,
    /// Also show what `vxds apply --prune` with the same scope would delete.
    #[command(flatten)]
    prune: super::prune::PruneArgs,
}

/// Exit code for "they differ".
const DIFFERENT: u8 = 1;
/// Exit code for "could not compare".
const FAILED: u8 = 2;

pub async fn run(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let fixtures = fixtures::load(&args.files)?;
    let scope = args.prune.scope()?;
    let validated = match validate_standalone(&fixtures.changeset(), &ValidationConfig::default()) {
        Ok(validated) => validated.changeset,
        Err(invalid) => {
            eprintln!("error: the fixtures break {} rule(s)", invalid.errors.len());
            for p in &invalid.errors {
                let value = serde_json::to_value(p).unwrap_or_default();
                eprintln!(
                    "{}",
                    super::format_item("error", &value, &|p| fixtures.locate(p))
                );
            }
            return Ok(ExitCode::from(FAILED));
        }
    };
    let local: Vec<(ResourceKey, ValidatedResource)> = validated
        .operations
        .into_iter()
        .filter_map(|op| match op.action {
            Action::Put(resource) => Some((op.key, *resource)),
            Action::Delete => None, // fixtures only put
        })
        .collect();

    let target = Target::connect(&args.target).await?;
    let mut result = compare(&target, &local, args.context).await;
    if let (Ok(text), Some(scope)) = (&mut result, &scope) {
        match pruned(&target, scope, &fixtures, args.context).await {
            Ok(deleted) => text.push_str(&deleted),
            Err(e) => result = Err(e),
        }
    }
    target.close().await;
    let text = result?;
    if text.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    super::out(&text);
    Ok(ExitCode::from(DIFFERENT))
}

type Variants = Vec<(String, Value)>;

/// What is compared of a variant: its body, and its TTL beside it when it has one (so that a
/// changed TTL shows as a difference too).
fn compared(body: Value, ttl: Option<&str>) -> Value {
    match ttl {
        Some(ttl) => serde_json::json!({"ttl": ttl, "resource": body}),
        None => body,
    }
}

/// Above this many resources, the diff reads the stored versions a page at a time first and
/// fetches only the resources whose version differs, instead of fetching each one.
const LISTED_ABOVE: usize = 100;

/// A validated resource's variants, in the form the diff compares.
fn local_variants(key: &ResourceKey, resource: &ValidatedResource) -> anyhow::Result<Variants> {
    let ty = ResourceType::resolve(&key.type_url)?;
    resource
        .variants
        .iter()
        .map(|v| {
            let body = vxds_envoy::resource::Body::json_of_any(&v.body, &ty)
                .map_err(|e| anyhow::anyhow!("{}", e.message))?;
            let ttl = v.ttl.map(|t| humantime::format_duration(t).to_string());
            Ok((v.constraints.to_string(), compared(body, ttl.as_deref())))
        })
        .collect()
}

/// Every stored version of the types `local` names, read a page at a time.
async fn stored_versions(
    target: &Target,
    local: &[(ResourceKey, ValidatedResource)],
) -> anyhow::Result<HashMap<(String, String), String>> {
    let types: BTreeSet<&str> = local.iter().map(|(k, _)| k.type_url.as_str()).collect();
    let mut versions = HashMap::new();
    for type_url in types {
        for (key, version) in target.list_versions(Some(type_url)).await? {
            versions.insert(key, version);
        }
    }
    Ok(versions)
}

/// The unified diffs of every resource that differs; empty when none does.
async fn compare(
    target: &Target,
    local: &[(ResourceKey, ValidatedResource)],
    context: usize,
) -> anyhow::Result<String> {
    let versions = if local.len() > LISTED_ABOVE {
        Some(stored_versions(target, local).await?)
    } else {
        None
    };
    let mut out = String::new();
    for (key, resource) in local {
        if let Some(versions) = &versions {
            let stored = versions.get(&(key.type_url.to_string(), key.name.clone()));
            // The version hashes every variant's constraints, body and TTL, in order: all
            // the diff compares.
            if stored == Some(&resource.version) {
                continue;
            }
        }
        let variants = &local_variants(key, resource)?;
        let path = format!(
            "/v1/resources/{}/{}",
            segment(&key.type_url),
            segment(&key.name)
        );
        let reply = target.call(Method::GET, &path, None).await?;
        let stored: Option<Variants> = match reply.status {
            200 => Some(stored_variants(&reply.body)),
            404 => None,
            _ => {
                target.expect_ok(reply)?;
                bail!("unexpected answer for {path}");
            }
        };
        let label = ResourceType::alias_of(&key.type_url).unwrap_or(&key.type_url);
        let at = format!("{label}/{}", key.name);
        let Some(theirs) = stored else {
            // New: the whole document.
            let ours = render(label, &key.name, variants)?;
            out.push_str(&unified(
                "",
                &ours,
                "/dev/null",
                &format!("fixtures/{at}"),
                context,
            ));
            continue;
        };
        let before = out.len();
        for (constraints, body) in variants {
            let ours = yaml(body)?;
            let header = format!("{at} [{constraints}]");
            match theirs.iter().find(|(c, _)| c == constraints) {
                Some((_, stored)) if stored == body => {}
                Some((_, stored)) => out.push_str(&unified(
                    &yaml(stored)?,
                    &ours,
                    &format!("server/{header}"),
                    &format!("fixtures/{header}"),
                    context,
                )),
                None => out.push_str(&unified(
                    "",
                    &variant_yaml(constraints, body)?,
                    "/dev/null",
                    &format!("fixtures/{header}"),
                    context,
                )),
            }
        }
        for (constraints, stored) in &theirs {
            if !variants.iter().any(|(c, _)| c == constraints) {
                out.push_str(&unified(
                    &variant_yaml(constraints, stored)?,
                    "",
                    &format!("server/{at} [{constraints}]"),
                    "/dev/null",
                    context,
                ));
            }
        }
        // The same variants in another order.
        if out.len() == before && theirs != *variants {
            let order = |v: &Variants| v.iter().map(|(c, _)| format!("{c}\n")).collect::<String>();
            out.push_str(&unified(
                &order(&theirs),
                &order(variants),
                &format!("server/{at} (variant order)"),
                &format!("fixtures/{at} (variant order)"),
                context,
            ));
        }
    }
    Ok(out)
}

/// What a prune in `scope` would delete, each resource whole against `/dev/null`.
async fn pruned(
    target: &Target,
    scope: &super::prune::Scope,
    fixtures: &fixtures::Fixtures,
    context: usize,
) -> anyhow::Result<String> {
    let keep = super::apply::mentioned_keys(fixtures);
    let mut out = String::new();
    for (type_url, name) in scope.deletions(target, &keep).await? {
        let path = format!("/v1/resources/{}/{}", segment(&type_url), segment(&name));
        let reply = target.call(Method::GET, &path, None).await?;
        if reply.status == 404 {
            continue; // deleted meanwhile
        }
        let reply = target.expect_ok(reply)?;
        let variants = stored_variants(&reply.body);
        let label = ResourceType::alias_of(&type_url).unwrap_or(&type_url);
        let theirs = render(label, &name, &variants)?;
        out.push_str(&unified(
            &theirs,
            "",
            &format!("server/{label}/{name}"),
            "/dev/null",
            context,
        ));
    }
    Ok(out)
}

fn unified(old: &str, new: &str, from: &str, to: &str, context: usize) -> String {
    TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(context)
        .header(from, to)
        .to_string()
}

fn yaml(value: &Value) -> anyhow::Result<String> {
    Ok(serde_norway::to_string(value)?)
}

/// A variant as a fixture writes it, for a variant only one side has.
fn variant_yaml(constraints: &str, body: &Value) -> anyhow::Result<String> {
    yaml(&json!({"constraints": constraints, "resource": body}))
}

/// A resource as the fixture document `vxds export` writes: the constraint text (left out
/// when unconstrained) above each body.
fn render(label: &str, name: &str, variants: &Variants) -> anyhow::Result<String> {
    let variants: Vec<Value> = variants
        .iter()
        .map(|(constraints, resource)| {
            if constraints == "*" {
                json!({"resource": resource})
            } else {
                json!({"constraints": constraints, "resource": resource})
            }
        })
        .collect();
    Ok(serde_norway::to_string(
        &json!({"type": label, "name": name, "variants": variants}),
    )?)
}

/// A resource's variants as the server answers them, in the form the diff compares.
fn stored_variants(body: &Value) -> Variants {
    body["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                v["constraints_text"].as_str().unwrap_or("*").to_owned(),
                compared(v["resource"].clone(), v["ttl"].as_str()),
            )
        })
        .collect()
}
