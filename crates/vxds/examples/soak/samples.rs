//! What the soak measures of each replica process: its samples (RSS, heap, open files), the
//! heap gauges from its `/metrics`, and the least-squares slope that tells growth from noise.

use std::time::Duration;

use vxds_testkit::bench::metric_mib;

/// One sample of a replica process.
#[derive(Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) at_s: f64,
    pub(crate) rss_mib: f64,
    /// RSS's anonymous part (heap, stacks) and its file-backed part (the binary's pages).
    pub(crate) anon_mib: f64,
    pub(crate) file_mib: f64,
    pub(crate) fds: f64,
    /// `vxds_heap_allocated_bytes` in MiB; None when the scrape failed (a restart).
    pub(crate) heap_mib: Option<f64>,
    /// `vxds_heap_resident_bytes` in MiB.
    pub(crate) resident_mib: Option<f64>,
}

/// The heap gauges (allocated, resident) in MiB from a replica's `/metrics`.
pub(crate) async fn heap_figures(
    client: &reqwest::Client,
    admin: &str,
) -> (Option<f64>, Option<f64>) {
    let Ok(response) = client
        .get(format!("{admin}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
    else {
        return (None, None);
    };
    let text = response.text().await.unwrap_or_default();
    (
        metric_mib(&text, "vxds_heap_allocated_bytes"),
        metric_mib(&text, "vxds_heap_resident_bytes"),
    )
}

/// A replica process's samples: replica 1 has two when it was restarted.
pub(crate) struct Process {
    pub(crate) label: String,
    pub(crate) pid: u32,
    pub(crate) started_s: f64,
    pub(crate) samples: Vec<Sample>,
}

/// Least-squares slope of `value` per hour, and the mean, over samples from `from_s` on.
pub(crate) fn slope_per_hour(
    samples: &[Sample],
    from_s: f64,
    value: fn(&Sample) -> Option<f64>,
) -> Option<(f64, f64, usize)> {
    let points: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.at_s >= from_s)
        .filter_map(|s| Some((s.at_s / 3600.0, value(s)?)))
        .collect();
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let cov: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    (var > 0.0).then(|| (cov / var, mean_y, points.len()))
}
