//! Every example in xRFC TP2, as the server must treat it.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use vxds_core::variants::{
    Domains, KeyCondition, KeyDomain, VariantLimits, VariantMatcher, VariantSetError,
    check_mutual_exclusivity, check_same_key_set, coverage, never_matching, validate_variant_set,
};
use vxds_core::{CanonicalConstraints, Constraint, Constraints, Limits, ParamSet};

fn variants(texts: &[&str]) -> Vec<CanonicalConstraints> {
    texts
        .iter()
        .map(|t| Constraints::parse(t, &Limits::DEFAULT).unwrap().canonical())
        .collect()
}

fn params(pairs: &[(&str, &str)]) -> ParamSet {
    pairs.iter().copied().collect()
}

fn eq(k: &str, v: &str) -> Constraint {
    Constraint::equals(k, v)
}

fn not(c: Constraint) -> Constraint {
    Constraint::not(c)
}

/// "Example": the four variants of a RouteConfiguration over `env` and `version`, written as
/// TP2 writes them (protobuf shapes).
fn four_variant_table() -> Vec<CanonicalConstraints> {
    let rows = [
        Constraint::And(vec![not(eq("env", "prod")), not(eq("version", "v1"))]),
        Constraint::And(vec![eq("env", "prod"), not(eq("version", "v1"))]),
        Constraint::And(vec![not(eq("env", "prod")), eq("version", "v1")]),
        Constraint::And(vec![eq("env", "prod"), eq("version", "v1")]),
    ];
    rows.into_iter()
        .map(|c| Constraints::new(c, &Limits::DEFAULT).unwrap().canonical())
        .collect()
}

#[test]
fn four_variant_table_is_valid_and_every_client_gets_its_row() {
    let table = four_variant_table();
    assert_eq!(
        validate_variant_set(&table, &VariantLimits::DEFAULT),
        Ok(())
    );
    let matcher = VariantMatcher::new(&table);
    let expect = [
        (params(&[("env", "prod"), ("version", "v1")]), 3),
        (params(&[("env", "prod"), ("version", "v2")]), 1),
        (params(&[("env", "prod"), ("version", "v3")]), 1),
        (params(&[("env", "canary"), ("version", "v1")]), 2),
        (params(&[("env", "test"), ("version", "v1")]), 2),
        (params(&[("env", "canary"), ("version", "v2")]), 0),
        (params(&[("env", "test"), ("version", "v3")]), 0),
        // Nine client kinds, four variants; absent keys fall in the `!=` rows.
        (params(&[("env", "prod")]), 1),
        (params(&[]), 0),
        (
            params(&[("env", "prod"), ("version", "v1"), ("zone", "eu")]),
            3,
        ),
    ];
    for (p, row) in expect {
        assert_eq!(matcher.resolve(&p), Some(row), "{p}");
        assert!(table[row].matches(&p));
    }
    // The domains of the example are fully covered.
    let domains: Domains = [
        ("env".to_owned(), KeyDomain::of(["prod", "canary", "test"])),
        ("version".to_owned(), KeyDomain::of(["v1", "v2", "v3"])),
    ]
    .into();
    let report = coverage(&table, &domains, &VariantLimits::DEFAULT).unwrap();
    assert!(report.is_complete());
    assert_eq!(report.total_count, Some(9));
    assert_eq!(report.uncovered_count, Some(0));
}

#[test]
fn basic_usage_two_variants_on_env() {
    let v = variants(&[r#"env = "prod""#, r#"env = "test""#]);
    assert_eq!(validate_variant_set(&v, &VariantLimits::DEFAULT), Ok(()));
    let m = VariantMatcher::new(&v);
    assert_eq!(m.resolve(&params(&[("env", "prod")])), Some(0));
    assert_eq!(m.resolve(&params(&[("env", "test")])), Some(1));
    // Unconstrained parameters do not prevent a match.
    assert_eq!(
        m.resolve(&params(&[("env", "test"), ("version", "v2")])),
        Some(1)
    );
    // No variant for qa: the resource does not exist for that client.
    assert_eq!(m.resolve(&params(&[("env", "qa")])), None);
}

#[test]
fn one_unconstrained_variant_serves_everyone() {
    let v = variants(&["*"]);
    assert_eq!(validate_variant_set(&v, &VariantLimits::DEFAULT), Ok(()));
    let m = VariantMatcher::new(&v);
    assert_eq!(m.resolve(&params(&[("env", "prod")])), Some(0));
    assert_eq!(m.resolve(&params(&[])), Some(0));
}

#[test]
fn transition_splitting_env_prod_by_version() {
    // Before: one variant per env. After: env=prod split by version; env=test unchanged.
    let after = variants(&[
        r#"env = "prod" && version = "v1""#,
        r#"env = "prod" && version = "v2""#,
        r#"env = "test""#,
    ]);
    // TP2 describes the split itself; vxds's same-key-set rule asks the test variant to
    // mention `version` too, which the `exists` spelling below does.
    assert!(matches!(
        check_same_key_set(&after).as_slice(),
        [VariantSetError::KeySetMismatch { variant: 2, missing, .. }] if missing == &["version"]
    ));
    assert!(check_mutual_exclusivity(&after, &VariantLimits::DEFAULT).is_empty());

    let after = variants(&[
        r#"env = "prod" && version = "v1""#,
        r#"env = "prod" && version = "v2""#,
        r#"env = "test" && (exists(version) || !exists(version))"#,
    ]);
    assert_eq!(
        validate_variant_set(&after, &VariantLimits::DEFAULT),
        Ok(())
    );
    let m = VariantMatcher::new(&after);
    assert_eq!(
        m.resolve(&params(&[("env", "prod"), ("version", "v1")])),
        Some(0)
    );
    assert_eq!(
        m.resolve(&params(&[("env", "prod"), ("version", "v2")])),
        Some(1)
    );
    assert_eq!(
        m.resolve(&params(&[("env", "test"), ("version", "v1")])),
        Some(2)
    );
}

#[test]
fn adding_a_new_key_on_the_server_first_is_refused() {
    // "Existing variant for older clients" next to a new variant with the version key.
    let v = variants(&[r#"env = "prod""#, r#"env = "prod" && version = "v1""#]);
    let errors = validate_variant_set(&v, &VariantLimits::DEFAULT).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, VariantSetError::KeySetMismatch { .. }))
    );
    let overlap = errors.iter().find_map(|e| match e {
        VariantSetError::Overlap {
            first: 0,
            second: 1,
            witness,
        } => Some(witness.clone()),
        _ => None,
    });
    assert_eq!(overlap, Some(params(&[("env", "prod"), ("version", "v1")])));
}

#[test]
fn exists_transition_example_is_accepted() {
    // TP2's fix: the default variant says explicitly "version not sent".
    let v = vec![
        Constraint::And(vec![eq("env", "prod"), not(Constraint::exists("version"))]),
        Constraint::And(vec![eq("env", "prod"), eq("version", "v1")]),
    ];
    let v: Vec<_> = v
        .into_iter()
        .map(|c| Constraints::new(c, &Limits::DEFAULT).unwrap().canonical())
        .collect();
    assert_eq!(validate_variant_set(&v, &VariantLimits::DEFAULT), Ok(()));
    let m = VariantMatcher::new(&v);
    assert_eq!(m.resolve(&params(&[("env", "prod")])), Some(0));
    assert_eq!(
        m.resolve(&params(&[("env", "prod"), ("version", "v1")])),
        Some(1)
    );
    // A client sending a version nobody serves gets nothing (TP2: a variant per value needed).
    assert_eq!(
        m.resolve(&params(&[("env", "prod"), ("version", "v2")])),
        None
    );

    // The coverage report says exactly that.
    let domains: Domains = [
        ("env".to_owned(), KeyDomain::of(["prod"])),
        (
            "version".to_owned(),
            KeyDomain::of(["v1", "v2"]).or_absent(),
        ),
    ]
    .into();
    let report = coverage(&v, &domains, &VariantLimits::DEFAULT).unwrap();
    assert_eq!(report.uncovered.len(), 1);
    let region = &report.uncovered[0];
    assert_eq!(
        region.conditions.get("version"),
        Some(&KeyCondition::OneOf(vec!["v2".into()]))
    );
    assert_eq!(
        region.example,
        params(&[("env", "prod"), ("version", "v2")])
    );
    assert_eq!(report.uncovered_count, Some(1));
    assert_eq!(report.total_count, Some(3));
}

#[test]
fn overlapping_or_example_is_refused_with_witness_env_test() {
    let v = variants(&[
        r#"env = "prod" || env = "test""#,
        r#"env = "qa" || env = "test""#,
    ]);
    let errors = validate_variant_set(&v, &VariantLimits::DEFAULT).unwrap_err();
    assert_eq!(
        errors,
        vec![VariantSetError::Overlap {
            first: 0,
            second: 1,
            witness: params(&[("env", "test")])
        }]
    );
    assert_eq!(
        errors[0].to_string(),
        "variants 0 and 1 overlap: both match {env=test}"
    );
    assert_eq!(errors[0].code(), "overlapping_variants");
}

#[test]
fn best_practice_foo_bar_baz_overlap_is_refused() {
    let v = variants(&[r#"k in ("foo", "bar")"#, r#"k in ("bar", "baz")"#]);
    let errors = check_mutual_exclusivity(&v, &VariantLimits::DEFAULT);
    assert_eq!(
        errors,
        vec![VariantSetError::Overlap {
            first: 0,
            second: 1,
            witness: params(&[("k", "bar")])
        }]
    );
}

#[test]
fn errors_name_both_variants_and_the_differing_keys() {
    let v = variants(&[
        r#"env = "a" && zone = "x""#,
        r#"env = "b" && zone = "y""#,
        r#"env = "c" && version = "1""#,
    ]);
    let errors = check_same_key_set(&v);
    assert_eq!(errors.len(), 1);
    let VariantSetError::KeySetMismatch {
        variant,
        reference,
        missing,
        extra,
        ..
    } = &errors[0]
    else {
        panic!("{errors:?}")
    };
    assert_eq!((*variant, *reference), (2, 0));
    assert_eq!(missing, &["zone"]);
    assert_eq!(extra, &["version"]);
    assert_eq!(
        errors[0].to_string(),
        "variant 2 constrains keys {env, version} but variant 0 constrains {env, zone}; missing {zone}; extra {version}"
    );
}

#[test]
fn duplicates_are_reported_once_not_as_overlaps() {
    let v = variants(&[
        r#"a = "1" && b = "2""#,
        r#"b = "2" && a = "1""#,
        r#"a = "2" && b = "2""#,
    ]);
    let errors = validate_variant_set(&v, &VariantLimits::DEFAULT).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(matches!(
        errors[0],
        VariantSetError::DuplicateVariant {
            first: 0,
            second: 1,
            ..
        }
    ));
}

#[test]
fn every_overlapping_pair_is_reported() {
    let v = variants(&["exists(k)", r#"k = "a""#, r#"k = "b""#, "!exists(k)"]);
    let errors = check_mutual_exclusivity(&v, &VariantLimits::DEFAULT);
    let pairs: Vec<(usize, usize)> = errors
        .iter()
        .map(|e| match e {
            VariantSetError::Overlap {
                first,
                second,
                witness,
            } => {
                assert!(v[*first].matches(witness) && v[*second].matches(witness));
                (*first, *second)
            }
            e => panic!("{e}"),
        })
        .collect();
    assert_eq!(pairs, vec![(0, 1), (0, 2)]);
}

#[test]
fn contradictions_are_found_as_never_matching() {
    let v = variants(&[r#"env = "a" && env = "b""#, r#"env = "c""#, "any()"]);
    assert_eq!(never_matching(&v, &VariantLimits::DEFAULT), Ok(vec![0, 2]));
}

#[test]
fn limits_on_variant_sets() {
    let many: Vec<_> = (0..40).map(|i| format!("k{i} = \"x\"")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let errors = validate_variant_set(&variants(&refs), &VariantLimits::DEFAULT).unwrap_err();
    assert!(errors.iter().any(|e| e.code() == "too_many_keys"));

    let limits = VariantLimits {
        max_variants: 2,
        ..VariantLimits::DEFAULT
    };
    let errors =
        validate_variant_set(&variants(&["a = 1", "a = 2", "a = 3"]), &limits).unwrap_err();
    assert_eq!(errors[0].code(), "too_many_variants");

    // A tight budget refuses rather than guessing.
    let limits = VariantLimits {
        analysis_budget: 5,
        ..VariantLimits::DEFAULT
    };
    let errors = check_mutual_exclusivity(&variants(&["a = 1", "a = 2", "a = 3"]), &limits);
    assert_eq!(errors[0].code(), "too_complex");
}

/// Issue 14 item 6: `a != "a{i}" && z = "z{i}"` for 200 `i` are pairwise exclusive through `z`.
/// Whether the irrelevant key sorts before the separating one must not matter, and the set is
/// decided far within the budget.
#[test]
fn separating_key_is_found_whatever_its_name() {
    for other in ["a", "zz"] {
        let texts: Vec<String> = (0..200)
            .map(|i| format!(r#"{other} != "a{i}" && z = "z{i}""#))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let v = variants(&refs);
        assert_eq!(
            validate_variant_set(&v, &VariantLimits::DEFAULT),
            Ok(()),
            "{other}"
        );
        // A twentieth of the budget is plenty (before the fix, the full budget was not).
        let tight = VariantLimits {
            analysis_budget: VariantLimits::DEFAULT.analysis_budget / 20,
            ..VariantLimits::DEFAULT
        };
        assert_eq!(validate_variant_set(&v, &tight), Ok(()), "{other}");
    }
}

/// Pairs no single key separates still need the search; it splits on the key that separates
/// most, not on the first in alphabetical order (`a`, compared with 200 values).
#[test]
fn search_splits_on_the_separating_key_first() {
    let mut texts = Vec::new();
    for i in 0..100 {
        // Within a group, x = y or x != y tells the two variants apart; z tells groups apart.
        for (same, diff) in [("1", "2"), ("2", "1")] {
            texts.push(format!(
                r#"a != "a{i}" && z in ("z{i}", "w{i}") && ((x = "1" && y = "{same}") || (x = "2" && y = "{diff}"))"#
            ));
        }
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let v = variants(&refs);
    let tight = VariantLimits {
        analysis_budget: VariantLimits::DEFAULT.analysis_budget / 10,
        ..VariantLimits::DEFAULT
    };
    assert_eq!(validate_variant_set(&v, &tight), Ok(()));
    // And one more that overlaps group 7's first variant is found, with a witness.
    texts.push(r#"a = "q" && z = "w7" && x = "1" && y = "1""#.to_owned());
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let v = variants(&refs);
    let errors = check_mutual_exclusivity(&v, &tight);
    let [
        VariantSetError::Overlap {
            first: 14,
            second: 200,
            witness,
        },
    ] = errors.as_slice()
    else {
        panic!("{errors:?}")
    };
    assert!(
        v[14].matches(witness) && v[200].matches(witness),
        "{witness}"
    );
}

#[test]
fn duplicates_carry_a_witness_when_they_match_something() {
    let v = variants(&[r#"a = "1" && b != "2""#, r#"b != "2" && a = "1""#]);
    let errors = check_mutual_exclusivity(&v, &VariantLimits::DEFAULT);
    let [
        e @ VariantSetError::DuplicateVariant {
            first: 0,
            second: 1,
            witness: Some(witness),
            ..
        },
    ] = errors.as_slice()
    else {
        panic!("{errors:?}")
    };
    assert!(v[0].matches(witness) && v[1].matches(witness));
    assert_eq!(e.witness(), Some(witness));
    assert!(
        e.to_string().ends_with(": both match {a=1, b=other}"),
        "{e}"
    );

    // Unconstrained twice: any parameter set, the empty one too.
    let v = variants(&["*", "*"]);
    let errors = check_mutual_exclusivity(&v, &VariantLimits::DEFAULT);
    assert!(
        matches!(
            errors.as_slice(),
            [VariantSetError::DuplicateVariant { witness: Some(w), never_matches: false, .. }] if w.is_empty()
        ),
        "{errors:?}"
    );

    // A contradiction twice is still a duplicate, with nothing to show, and says so.
    let v = variants(&[r#"a = "1" && a = "2""#, r#"a = "2" && a = "1""#]);
    let errors = check_mutual_exclusivity(&v, &VariantLimits::DEFAULT);
    let [
        e @ VariantSetError::DuplicateVariant {
            witness: None,
            never_matches: true,
            ..
        },
    ] = errors.as_slice()
    else {
        panic!("{errors:?}")
    };
    assert!(
        e.to_string()
            .ends_with(", which no parameter set can match"),
        "{e}"
    );
}

#[test]
fn same_key_set_is_checked_on_the_keys_as_written() {
    // Constant folding turns the first into `env = "a"`; the operator wrote `v` all the same.
    let v = variants(&[r#"env = "a" && (v = "1" || *)"#, r#"env = "b" && v = "2""#]);
    assert_eq!(v[0].to_string(), r#"env = "a""#);
    assert_eq!(validate_variant_set(&v, &VariantLimits::DEFAULT), Ok(()));

    // And a mismatch names the keys as written.
    let v = variants(&[
        r#"env = "a" && (zone = "x" || *)"#,
        r#"env = "b" && v = "2""#,
    ]);
    let errors = check_same_key_set(&v);
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "variant 1 constrains keys {env, v} but variant 0 constrains {env, zone}; missing {zone}; extra {v}"
        ]
    );
}
