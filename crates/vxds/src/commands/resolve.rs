//! `vxds resolve TYPE NAME key=value...`: the variant a client with these parameters receives.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::bail;
use axum::http::Method;
use clap::Args;
use serde_json::json;

use super::{out, print_problem, refused};
use crate::target::{Target, TargetArgs};

#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// The resource type: an alias (`route`) or a message name.
    #[arg(value_name = "TYPE")]
    resource_type: String,
    name: String,
    /// The client's dynamic parameters, as `key=value`.
    #[arg(value_name = "KEY=VALUE")]
    params: Vec<String>,
    /// The client certificate's identity (e.g. `spiffe://td/ns/shop/sa/envoy`): the server's
    /// identity template turns it into trusted parameters that override KEY=VALUE, as for a
    /// connected client.
    #[arg(long)]
    identity: Option<String>,
    #[command(flatten)]
    target: TargetArgs,
    /// Print the whole answer as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let mut params = BTreeMap::new();
    for param in &args.params {
        let Some((key, value)) = param.split_once('=') else {
            bail!("`{param}` is not `key=value`");
        };
        params.insert(key.to_owned(), value.to_owned());
    }
    let target = Target::connect(&args.target).await?;
    let mut body = json!({"type": args.resource_type, "name": args.name, "params": params});
    if let Some(identity) = &args.identity {
        body["identity"] = json!(identity);
    }
    let reply = target.call(Method::POST, "/v1/resolve", Some(&body)).await;
    target.close().await;
    let reply = reply?;
    if reply.status != 200 {
        print_problem(&reply.body, &|p: &str| p.to_owned());
        return Ok(if reply.status == 404 || reply.status == 400 {
            refused()
        } else {
            ExitCode::from(2)
        });
    }
    if args.json {
        out(&format!("{}\n", serde_json::to_string_pretty(&reply.body)?));
    } else {
        let mut text = format!("{}\n", reply.body["reason"].as_str().unwrap_or_default());
        let trusted: Vec<String> = reply.body["param_sources"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, source)| *source == "identity")
            .map(|(key, _)| {
                format!(
                    "{key}={}",
                    reply.body["params"][key].as_str().unwrap_or_default()
                )
            })
            .collect();
        if !trusted.is_empty() {
            text.push_str(&format!(
                "trusted (from the identity): {}\n",
                trusted.join(", ")
            ));
        }
        if let Some(variant) = reply.body["variant"].as_object() {
            text.push_str(&format!(
                "constraints: {}\n",
                variant["constraints_text"].as_str().unwrap_or_default()
            ));
            text.push_str(&format!(
                "version: {}\n",
                variant["version"].as_str().unwrap_or_default()
            ));
            text.push_str(&serde_norway::to_string(&variant["resource"])?);
        }
        out(&text);
    }
    Ok(if reply.body["variant"].is_null() {
        refused()
    } else {
        ExitCode::SUCCESS
    })
}
