//! The command-line commands other than `serve`. Exit codes: 0 success, 1 refused (invalid
//! input, or no variant matches), 2 any other failure.

pub mod apply;
pub mod dev_certs;
pub mod diff;
pub mod export;
pub mod impact;
pub mod prune;
pub mod resolve;
pub mod rollback;
pub mod rollout;
pub mod token;
pub mod validate;

use std::io::Write;
use std::process::ExitCode;

use serde_json::Value;

/// Writes to standard output. A reader that went away (`vxds export | head`) is not an error:
/// the process ends quietly, as Unix tools do.
pub fn out(text: &str) {
    out_bytes(text.as_bytes());
}

/// [`out`] for bytes.
pub fn out_bytes(bytes: &[u8]) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to standard output: {e}");
        std::process::exit(2);
    }
}

/// Exit code for "the input was refused".
pub fn refused() -> ExitCode {
    ExitCode::from(1)
}

/// Prints a problem document's errors and warnings, each located by `locate` (which turns a
/// JSON pointer into something a person can find, e.g. a fixture file and document).
pub fn print_problem(problem: &Value, locate: &dyn Fn(&str) -> String) {
    let detail = problem["detail"].as_str().unwrap_or("the request failed");
    eprintln!("error: {detail}");
    for (label, key) in [("error", "errors"), ("warning", "warnings")] {
        for item in problem[key].as_array().into_iter().flatten() {
            eprintln!("{}", format_item(label, item, locate));
        }
    }
}

pub fn format_item(label: &str, item: &Value, locate: &dyn Fn(&str) -> String) -> String {
    let pointer = item["pointer"].as_str().unwrap_or_default();
    let mut at = locate(pointer);
    if let Some(parameter) = item["parameter"].as_str() {
        at = format!("parameter `{parameter}`");
    }
    let mut line = format!(
        "  {label}: {at}: {} [{}]",
        item["message"].as_str().unwrap_or_default(),
        item["code"].as_str().unwrap_or_default()
    );
    if let Some(witness) = item["witness"].as_object() {
        let shown: Vec<String> = witness
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        line.push_str(&format!(" (witness: {{{}}})", shown.join(", ")));
    }
    line
}

/// One line per changed resource of a write's answer: `  updated  route      web`.
pub fn change_table(changed: &[Value]) -> String {
    let mut text = String::new();
    for change in changed {
        let ty = change["type"]
            .as_str()
            .or(change["type_url"].as_str())
            .unwrap_or_default();
        text.push_str(&format!(
            "  {:<8} {:<10} {}\n",
            change["change"].as_str().unwrap_or_default(),
            ty,
            change["name"].as_str().unwrap_or_default()
        ));
    }
    text
}
