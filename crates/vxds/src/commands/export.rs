//! `vxds export`: the store as fixture documents that `vxds apply` takes back unchanged.
//!
//! One request, `GET /v1/export`, which reads the store in one snapshot; its answer is written
//! out as it arrives.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

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

pub async fn run(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let target = Target::connect_without_index(&args.target).await?;
    let result = export(&args, &target).await;
    target.close().await;
    if result.is_err()
        && let Some(path) = &args.output
    {
        // A cut-off export must not pass for a whole one.
        let _ = std::fs::remove_file(path);
    }
    result?;
    Ok(ExitCode::SUCCESS)
}

async fn export(args: &ExportArgs, target: &Target) -> anyhow::Result<()> {
    let mut path = "/v1/export".to_owned();
    if let Some(t) = &args.resource_type {
        path.push_str(&format!("?type={}", segment(t)));
    }
    match &args.output {
        Some(file) => {
            let mut out = BufWriter::new(
                File::create(file).with_context(|| format!("creating {}", file.display()))?,
            );
            target
                .stream(&path, |piece| Ok(out.write_all(piece)?))
                .await?;
            out.flush()?;
        }
        None => {
            target
                .stream(&path, |piece| {
                    super::out_bytes(piece);
                    Ok(())
                })
                .await?
        }
    }
    Ok(())
}
