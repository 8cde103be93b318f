//! `--against`: the same measurement of two servers, side by side in one run.
//!
//! Absolute times drift on a shared machine, so a figure only means something beside the
//! baseline's taken at the same moment: this runs the load generator again (a fresh process
//! per run, with the same arguments) against the baseline server and against vxds in turn,
//! `--runs` times each, and prints both sets of medians and vxds ÷ baseline — p99 also as the
//! median of the ratios of runs taken back to back.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use super::load::median;

/// The flags this mode reads (each with its value), left out of the runs' own arguments.
const OWN_FLAGS: [&str; 2] = ["--against", "--runs"];

/// One run's `RESULT` line, by key.
type Figures = BTreeMap<String, f64>;

/// Runs the baseline at `against` and vxds (`--vxds`, or the default) `runs` times each,
/// alternating, and prints the comparison.
pub fn run(against: &Path, runs: usize) -> anyhow::Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    // Absolute: the load generator starts servers from a directory of their own.
    let against = std::fs::canonicalize(against)
        .with_context(|| format!("--against {}", against.display()))?;
    let own: Vec<OsString> = std::env::args_os().skip(1).collect();
    let common = without_flags(&own, &OWN_FLAGS);
    let mut baseline_args = without_flags(&common, &["--vxds"]);
    baseline_args.push("--vxds".into());
    baseline_args.push(against.as_os_str().to_owned());
    let exe = std::env::current_exe()?;
    let (mut baseline, mut vxds) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        for (name, args, results) in [
            ("baseline", &baseline_args, &mut baseline),
            ("vxds", &common, &mut vxds),
        ] {
            eprintln!("run {run}/{runs}: {name}");
            let figures = measure(&exe, args).with_context(|| format!("{name}, run {run}"))?;
            println!("{name:8} run {run}: {}", describe(&figures));
            results.push(figures);
        }
    }
    println!();
    println!("{}", summary(&baseline, &vxds));
    Ok(())
}

/// `args` without each of `flags` and its value (`--flag value` or `--flag=value`).
fn without_flags(args: &[OsString], flags: &[&str]) -> Vec<OsString> {
    let mut kept = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let text = arg.to_string_lossy();
        if flags.contains(&text.as_ref()) {
            skip_value = true;
        } else if !flags.iter().any(|f| text.starts_with(&format!("{f}="))) {
            kept.push(arg.clone());
        }
    }
    kept
}

/// One run of this load generator with `args`: its `RESULT` line's figures. Its other output
/// goes to stderr, as it comes.
fn measure(exe: &Path, args: &[OsString]) -> anyhow::Result<Figures> {
    let output = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running the load generator")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprint!("{stdout}");
    if !output.status.success() {
        bail!("the load generator failed: {}", output.status);
    }
    let line = (stdout.lines().rev())
        .find_map(|l| l.strip_prefix("RESULT "))
        .context("no RESULT line in the load generator's output")?;
    Ok(parse_result(line))
}

/// `key=value` pairs whose values are numbers.
fn parse_result(line: &str) -> Figures {
    line.split_whitespace()
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn describe(f: &Figures) -> String {
    let get = |k: &str| f.get(k).copied().unwrap_or(f64::NAN);
    format!(
        "sync {:.2} s, p99 {:.0} ms, server CPU {:.2} s, {:.1} KiB per stream",
        get("sync_s"),
        get("p99_ms"),
        get("server_cpu_s"),
        get("kib_per_stream")
    )
}

fn median_of(runs: &[Figures], key: &str) -> f64 {
    median(
        &mut runs
            .iter()
            .filter_map(|f| f.get(key).copied())
            .collect::<Vec<_>>(),
    )
}

/// Both servers' medians and vxds ÷ baseline.
fn summary(baseline: &[Figures], vxds: &[Figures]) -> String {
    let mut out = format!(
        "medians of {} runs each  {:>10} {:>10} {:>8}\n",
        baseline.len(),
        "baseline",
        "vxds",
        "ratio"
    );
    for (key, label) in [
        ("sync_s", "initial sync (s)"),
        ("p99_ms", "fan-out p99 (ms)"),
        ("p50_ms", "fan-out p50 (ms)"),
        ("server_cpu_s", "server CPU (s)"),
        ("kib_per_stream", "RSS per stream (KiB)"),
    ] {
        let (b, v) = (median_of(baseline, key), median_of(vxds, key));
        out += &format!("{label:24} {b:>10.2} {v:>10.2} {:>8.2}\n", v / b);
    }
    let mut pairs: Vec<f64> = (baseline.iter().zip(vxds))
        .filter_map(|(b, v)| Some(v.get("p99_ms")? / b.get("p99_ms")?))
        .collect();
    let pairwise = median(&mut pairs);
    out += &format!(
        "{:24} {:>10} {:>10} {pairwise:>8.2}\n",
        "p99, run by run", "", ""
    );
    out += &format!(
        "RATIO sync={:.3} p99={:.3} p99_pairwise={pairwise:.3} server_cpu={:.3}",
        median_of(vxds, "sync_s") / median_of(baseline, "sync_s"),
        median_of(vxds, "p99_ms") / median_of(baseline, "p99_ms"),
        median_of(vxds, "server_cpu_s") / median_of(baseline, "server_cpu_s"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn own_flags_are_left_out_in_both_spellings() {
        let args = os(&[
            "--streams",
            "10",
            "--against",
            "b",
            "--runs=3",
            "--vxds",
            "v",
            "--pin",
        ]);
        assert_eq!(
            without_flags(&args, &OWN_FLAGS),
            os(&["--streams", "10", "--vxds", "v", "--pin"])
        );
        assert_eq!(
            without_flags(&args, &["--vxds", "--against", "--runs"]),
            os(&["--streams", "10", "--pin"])
        );
    }

    #[test]
    fn the_summary_takes_medians_and_pairs_runs_in_order() {
        let run = |p99: f64, cpu: f64| {
            parse_result(&format!(
                "streams=10 sync_s=1 p99_ms={p99} server_cpu_s={cpu} kib_per_stream=20"
            ))
        };
        let baseline = [run(100.0, 1.0), run(200.0, 2.0), run(300.0, 3.0)];
        let vxds = [run(110.0, 1.2), run(260.0, 2.4), run(300.0, 3.6)];
        let text = summary(&baseline, &vxds);
        // Medians 200 and 260: 1.3; run by run 1.1, 1.3, 1.0: 1.1.
        assert!(
            text.ends_with("RATIO sync=1.000 p99=1.300 p99_pairwise=1.100 server_cpu=1.200"),
            "{text}"
        );
    }
}
