//! `vxds export`: the store as fixture documents that `vxds apply` takes back unchanged.

use std::path::PathBuf;
use std::process::ExitCode;

use axum::http::Method;
use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::target::{Target, TargetArgs, segment};

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Only resources of this type (alias or message name).
    #[arg(long = "type")]
    resource_type: Option<String>,
    /// Write here instead of standard output.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

#[derive(Serialize)]
struct Document {
    #[serde(rename = "type")]
    resource_type: String,
    name: String,
    variants: Vec<Variant>,
}

#[derive(Serialize)]
struct Variant {
    #[serde(skip_serializing_if = "Option::is_none")]
    constraints: Option<String>,
    resource: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<String>,
}

pub async fn run(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let target = Target::connect(&args.target).await?;
    let result = export(&args, &target).await;
    target.close().await;
    let yaml = result?;
    match &args.output {
        Some(path) => std::fs::write(path, yaml)?,
        None => super::out(&yaml),
    }
    Ok(ExitCode::SUCCESS)
}

async fn export(args: &ExportArgs, target: &Target) -> anyhow::Result<String> {
    let mut out = String::new();
    for (type_url, name) in target.list_all(args.resource_type.as_deref()).await? {
        let path = format!("/v1/resources/{}/{}", segment(&type_url), segment(&name));
        let reply = target.expect_ok(target.call(Method::GET, &path, None).await?)?;
        let resource = reply.body;
        let document = Document {
            resource_type: resource["type"].as_str().unwrap_or(&type_url).to_owned(),
            name: resource["name"].as_str().unwrap_or(&name).to_owned(),
            variants: resource["variants"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| Variant {
                    constraints: v["constraints_text"]
                        .as_str()
                        .filter(|t| *t != "*")
                        .map(str::to_owned),
                    resource: v["resource"].clone(),
                    ttl: v["ttl"].as_str().map(str::to_owned),
                })
                .collect(),
        };
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&document)?);
    }
    Ok(out)
}
