//! Fixture files: YAML (multi-document) or JSON (one document or an array), each document a
//! resource as a put operation has it: `{type, name, variants}`. Folders are read recursively,
//! files in name order. Problems point back at the file, line and column, and the document,
//! they came from ([`position`]).

mod position;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::Value;
use vxds_envoy::changeset::{ChangesetRequest, OperationRequest, PutRequest};
use vxds_envoy::pointer::pointer_from_serde_path;

/// Where a document came from.
#[derive(Clone, Debug)]
pub struct Source {
    pub file: PathBuf,
    /// 1-based, counting documents that hold something.
    pub document: usize,
    /// The file's text, to find positions in.
    text: Arc<str>,
    place: Place,
}

/// Where in its file's text a document is.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// YAML document `n` (from 0, counting empty ones).
    Yaml(usize),
    /// Element `n` of a JSON file's top-level array.
    JsonElement(usize),
    /// A JSON file's one document.
    Json,
}

impl Source {
    /// `file:line:column (document n)` for the node `pointer` (into the document) names.
    pub fn describe(&self, pointer: &str) -> String {
        let mut path = position::tokens(pointer);
        let document = match self.place {
            Place::Yaml(n) => n,
            Place::JsonElement(n) => {
                path.insert(0, n.to_string());
                0
            }
            Place::Json => 0,
        };
        match position::position(&self.text, document, &path) {
            Some((line, column)) => format!(
                "{}:{line}:{column} (document {})",
                self.file.display(),
                self.document
            ),
            None => format!("{} (document {})", self.file.display(), self.document),
        }
    }
}

#[derive(Debug, Default)]
pub struct Fixtures {
    pub documents: Vec<PutRequest>,
    pub sources: Vec<Source>,
    pub files: usize,
}

impl Fixtures {
    /// All documents as one changeset of puts, in file order.
    pub fn changeset(&self) -> ChangesetRequest {
        ChangesetRequest {
            operations: self
                .documents
                .iter()
                .cloned()
                .map(OperationRequest::Put)
                .collect(),
            ..Default::default()
        }
    }

    /// `/operations/3/variants/1` as `routes.yaml (document 2) /variants/1`.
    pub fn locate(&self, pointer: &str) -> String {
        let Some(rest) = pointer.strip_prefix("/operations/") else {
            return if pointer.is_empty() {
                "the changeset".into()
            } else {
                pointer.to_owned()
            };
        };
        let (index, tail) = rest.split_once('/').map_or((rest, ""), |(i, t)| (i, t));
        match index
            .parse::<usize>()
            .ok()
            .and_then(|i| self.sources.get(i))
        {
            Some(source) => {
                let tail = if tail.is_empty() {
                    String::new()
                } else {
                    format!("/{tail}")
                };
                let at = source.describe(&tail);
                if tail.is_empty() {
                    at
                } else {
                    format!("{at} {tail}")
                }
            }
            None => format!(
                "operation {index}{}",
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(" /{tail}")
                }
            ),
        }
    }
}

pub fn load(paths: &[PathBuf]) -> anyhow::Result<Fixtures> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    if files.is_empty() {
        bail!(
            "no fixture files (*.yaml, *.yml, *.json) under {}",
            show(paths)
        );
    }
    let mut fixtures = Fixtures {
        files: files.len(),
        ..Default::default()
    };
    for file in files {
        let text: Arc<str> = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .into();
        let mut i = 0;
        documents(&file, &text, |place, value| {
            i += 1;
            let source = Source {
                file: file.clone(),
                document: i,
                text: text.clone(),
                place,
            };
            let document: PutRequest = serde_path_to_error::deserialize(value).map_err(|e| {
                let pointer = pointer_from_serde_path(e.path()).to_string();
                anyhow::anyhow!(
                    "{} {}: {}",
                    source.describe(&pointer),
                    if pointer.is_empty() { "/" } else { &pointer },
                    e.inner()
                )
            })?;
            fixtures.documents.push(document);
            fixtures.sources.push(source);
            Ok(())
        })?;
    }
    Ok(fixtures)
}

fn show(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_file() {
        out.push(path.to_owned());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            !p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'))
        })
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect(&entry, out)?;
        } else if matches!(
            entry.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(entry);
        }
    }
    Ok(())
}

/// Each document of a file that holds something, with where it is, handed to `each` as soon as
/// it is read (a large export is never a tree of values whole).
fn documents(
    file: &Path,
    text: &str,
    mut each: impl FnMut(Place, Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let is_json = file.extension().and_then(|e| e.to_str()) == Some("json");
    if is_json {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            anyhow::anyhow!(
                "{}:{}:{}: not valid JSON: {e}",
                file.display(),
                e.line(),
                e.column()
            )
        })?;
        return match value {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .try_for_each(|(n, v)| each(Place::JsonElement(n), v)),
            other => each(Place::Json, other),
        };
    }
    let mut held = 0;
    for (n, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|e| {
            let at = e.location().map_or_else(
                || file.display().to_string(),
                |l| format!("{}:{}:{}", file.display(), l.line(), l.column()),
            );
            anyhow::anyhow!("{at} (document {}): not valid YAML: {e}", held + 1)
        })?;
        if !value.is_null() {
            held += 1;
            each(Place::Yaml(n), value)?;
        }
    }
    Ok(())
}
