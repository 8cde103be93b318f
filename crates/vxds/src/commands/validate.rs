//! `vxds validate -f PATH...`: every rule the server checks, offline — no server, no database.
//! The fixtures stand for the whole store, so cross-resource rules (the aggregate-cluster
//! graph) are checked among them. What a CI pipeline runs on every pull request.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use vxds_envoy::changeset::{ValidationConfig, validate_standalone};

use super::refused;
use crate::fixtures;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Fixture files or folders.
    #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// xdstp authorities the server serves (as `serve --authority`); none allows any.
    #[arg(long = "authority", env = "VXDS_AUTHORITIES", value_delimiter = ',')]
    authorities: Vec<String>,
    /// The identity template the server runs with (as `serve --xds-identity-template`): secret
    /// variants that constrain none of its keys are reported, as anyone could obtain them.
    #[arg(long = "identity-template", env = "VXDS_XDS_IDENTITY_TEMPLATE")]
    identity_template: Option<String>,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let fixtures = fixtures::load(&args.files)?;
    let template = args
        .identity_template
        .as_deref()
        .map(vxds_core::IdentityTemplate::parse)
        .transpose()?;
    let config = ValidationConfig {
        authorities: args.authorities,
        trusted_keys: template
            .iter()
            .flat_map(|t| t.keys().map(str::to_owned))
            .collect(),
        ..Default::default()
    };
    let locate = |p: &str| fixtures.locate(p);
    match validate_standalone(&fixtures.changeset(), &config) {
        Ok(validated) => {
            for w in &validated.warnings {
                let value = serde_json::to_value(w).unwrap_or_default();
                eprintln!("{}", super::format_item("warning", &value, &locate));
            }
            super::out(&format!(
                "ok: {} resource{} in {} file{} pass every rule\n",
                fixtures.documents.len(),
                if fixtures.documents.len() == 1 {
                    ""
                } else {
                    "s"
                },
                fixtures.files,
                if fixtures.files == 1 { "" } else { "s" }
            ));
            Ok(ExitCode::SUCCESS)
        }
        Err(invalid) => {
            eprintln!(
                "error: {} problem{} found",
                invalid.errors.len(),
                if invalid.errors.len() == 1 { "" } else { "s" }
            );
            for problem in invalid
                .errors
                .iter()
                .map(|e| ("error", e))
                .chain(invalid.warnings.iter().map(|w| ("warning", w)))
            {
                let (label, p) = problem;
                let value = serde_json::to_value(p).unwrap_or_default();
                eprintln!("{}", super::format_item(label, &value, &locate));
            }
            Ok(refused())
        }
    }
}
