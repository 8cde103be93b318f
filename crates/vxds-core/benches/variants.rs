//! Variant-set validation and resolution on TP2-style tables.
//!
//! A table of `n` variants over `k` keys is the start of the cross product of per-key cells:
//! `key = "v0"`, ..., `key = "v{m-1}"` and the default `key not in (...)`, with the smallest
//! `m` for which the product holds `n` rows. The variants are mutually exclusive and constrain
//! the same keys, as the store requires, so validation does its whole job.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use vxds_core::variants::{VariantLimits, VariantMatcher, validate_variant_set};
use vxds_core::{CanonicalConstraints, Constraint, Constraints, Limits, ParamSet};

const SIZES: [(usize, usize); 9] = [
    (8, 2),
    (8, 4),
    (8, 6),
    (64, 2),
    (64, 4),
    (64, 6),
    (256, 2),
    (256, 4),
    (256, 6),
];

fn values_per_key(variants: usize, keys: usize) -> usize {
    (1..)
        .find(|m: &usize| (m + 1).pow(keys as u32) >= variants)
        .unwrap_or(1)
}

fn table(variants: usize, keys: usize) -> Vec<CanonicalConstraints> {
    let m = values_per_key(variants, keys);
    (0..variants)
        .map(|row| {
            let mut rest = row;
            let cells = (0..keys)
                .map(|k| {
                    let cell = rest % (m + 1);
                    rest /= m + 1;
                    let key = format!("key{k}");
                    if cell < m {
                        Constraint::equals(key, format!("v{cell}"))
                    } else {
                        let all = (0..m).map(|i| Constraint::equals(key.clone(), format!("v{i}")));
                        Constraint::not(Constraint::Or(all.collect()))
                    }
                })
                .collect();
            Constraints::new(Constraint::And(cells), &Limits::DEFAULT)
                .expect("bench constraints are within limits")
                .canonical()
        })
        .collect()
}

/// Parameter sets spread over the table: every cell value, some unknown values and absences.
fn clients(keys: usize, m: usize) -> Vec<ParamSet> {
    (0..64)
        .map(|i| {
            (0..keys)
                .filter_map(|k| match (i + 3 * k) % (m + 2) {
                    c if c < m => Some((format!("key{k}"), format!("v{c}"))),
                    c if c == m => Some((format!("key{k}"), "unknown".to_owned())),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

fn bench_validate(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate_variant_set");
    for (n, k) in SIZES {
        let variants = table(n, k);
        assert!(validate_variant_set(&variants, &VariantLimits::DEFAULT).is_ok());
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{n}x{k}")),
            &variants,
            |b, v| b.iter(|| validate_variant_set(black_box(v), &VariantLimits::DEFAULT)),
        );
    }
    group.finish();
}

fn bench_matcher_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("matcher_build");
    for (n, k) in SIZES {
        let variants = table(n, k);
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{n}x{k}")),
            &variants,
            |b, v| b.iter(|| VariantMatcher::new(black_box(v))),
        );
    }
    group.finish();
}

fn bench_resolve(c: &mut Criterion) {
    let mut group = c.benchmark_group("resolve");
    for (n, k) in SIZES {
        let variants = table(n, k);
        let matcher = VariantMatcher::new(&variants);
        assert!(!matcher.is_scanning());
        let clients = clients(k, values_per_key(n, k));
        // Same answers as a scan, so the figure measures a correct matcher.
        for p in &clients {
            assert_eq!(
                matcher.resolve(p),
                variants.iter().position(|v| v.matches(p))
            );
        }
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{n}x{k}")),
            &clients,
            |b, cs| {
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) % cs.len();
                    matcher.resolve(black_box(&cs[i]))
                })
            },
        );
        // The scan resolve avoids, for comparison.
        group.bench_with_input(
            BenchmarkId::new("scan", format!("{n}x{k}")),
            &clients,
            |b, cs| {
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) % cs.len();
                    variants.iter().position(|v| v.matches(black_box(&cs[i])))
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_validate, bench_matcher_build, bench_resolve);
criterion_main!(benches);
