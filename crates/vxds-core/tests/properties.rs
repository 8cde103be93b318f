//! Property tests: the analyses agree with brute force over small domains.
//!
//! Constraints range over keys {a, b, c} and values {1, 2, 3}; brute force tries every key
//! absent or set to 1, 2, 3 or 4 (a value no constraint mentions), 125 parameter sets in all,
//! which by the class argument covers every behaviour.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use vxds_core::variants::{
    Domains, KeyCondition, KeyDomain, VariantLimits, VariantMatcher, VariantSetError,
    check_mutual_exclusivity, coverage,
};
use vxds_core::xdstp::{XdstpUrl, XdstpUrn, normalize};
use vxds_core::{CanonicalConstraints, Constraint, Constraints, Limits, ParamSet};

const KEYS: [&str; 3] = ["a", "b", "c"];
const VALUES: [&str; 3] = ["1", "2", "3"];

fn leaf() -> impl Strategy<Value = Constraint> {
    prop_oneof![
        4 => (prop::sample::select(&KEYS[..]), prop::sample::select(&VALUES[..]))
            .prop_map(|(k, v)| Constraint::equals(k, v)),
        2 => prop::sample::select(&KEYS[..]).prop_map(Constraint::exists),
        1 => Just(Constraint::Any),
    ]
}

fn constraint() -> impl Strategy<Value = Constraint> {
    leaf().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Constraint::And),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Constraint::Or),
            inner.prop_map(Constraint::not),
        ]
    })
}

fn canonical(c: &Constraint) -> CanonicalConstraints {
    Constraints::new(c.clone(), &Limits::DEFAULT)
        .unwrap()
        .canonical()
}

/// All 125 parameter sets of the brute-force domain.
fn all_params() -> Vec<ParamSet> {
    let choices = [None, Some("1"), Some("2"), Some("3"), Some("4")];
    let mut out = Vec::new();
    for a in choices {
        for b in choices {
            for c in choices {
                let mut p = ParamSet::new();
                for (k, v) in KEYS.iter().zip([a, b, c]) {
                    if let Some(v) = v {
                        p.insert(*k, v);
                    }
                }
                out.push(p);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn exclusivity_and_witness_agree_with_brute_force(cs in prop::collection::vec(constraint(), 1..6)) {
        let variants: Vec<CanonicalConstraints> = cs.iter().map(canonical).collect();
        let errors = check_mutual_exclusivity(&variants, &VariantLimits::DEFAULT);

        // Identical identities are duplicates; the rest is decided pairwise.
        let mut seen = BTreeMap::new();
        let mut expected_duplicates = BTreeSet::new();
        for (i, v) in variants.iter().enumerate() {
            if let Some(&first) = seen.get(&v.id()) {
                expected_duplicates.insert((first, i));
            } else {
                seen.insert(v.id(), i);
            }
        }
        let distinct: Vec<usize> = seen.values().copied().collect::<BTreeSet<_>>().into_iter().collect();
        let params = all_params();
        let mut expected_overlaps = BTreeSet::new();
        for (x, &i) in distinct.iter().enumerate() {
            for &j in &distinct[x + 1..] {
                if params.iter().any(|p| variants[i].matches(p) && variants[j].matches(p)) {
                    expected_overlaps.insert((i, j));
                }
            }
        }

        let mut overlaps = BTreeSet::new();
        let mut duplicates = BTreeSet::new();
        for e in &errors {
            match e {
                VariantSetError::Overlap { first, second, witness } => {
                    prop_assert!(variants[*first].matches(witness), "{witness} misses {first}");
                    prop_assert!(variants[*second].matches(witness), "{witness} misses {second}");
                    overlaps.insert((*first, *second));
                }
                VariantSetError::DuplicateVariant { first, second, .. } => {
                    duplicates.insert((*first, *second));
                }
                other => prop_assert!(false, "unexpected {other}"),
            }
        }
        prop_assert_eq!(overlaps, expected_overlaps);
        prop_assert_eq!(duplicates, expected_duplicates);
    }

    #[test]
    fn canonical_form_is_idempotent_and_preserves_meaning(c in constraint()) {
        let once = canonical(&c);
        let twice = once.constraints().canonical();
        prop_assert_eq!(&once, &twice);
        prop_assert_eq!(once.id(), twice.id());
        let original = Constraints::new(c, &Limits::DEFAULT).unwrap();
        for p in all_params() {
            prop_assert_eq!(original.matches(&p), once.matches(&p), "{}", p);
        }
    }

    #[test]
    fn respellings_share_one_identity(c in constraint(), seed in any::<u64>()) {
        let mut rng = seed;
        let respelt = respell(&c, &mut rng);
        prop_assert_eq!(canonical(&c).id(), canonical(&respelt).id(), "{} vs {}", c, respelt);
    }

    #[test]
    fn text_syntax_round_trips(c in text_constraint()) {
        let text = c.to_string();
        let parsed = Constraints::parse(&text, &Limits::DEFAULT)
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        match parsed.root() {
            Some(root) => prop_assert_eq!(root, &c, "{}", text),
            // Only a top-level `*` reads back as unconstrained.
            None => prop_assert_eq!(&c, &Constraint::Any),
        }
        prop_assert_eq!(parsed.to_string(), text);
    }

    #[test]
    fn matcher_agrees_with_a_scan(cs in prop::collection::vec(constraint(), 1..6)) {
        let variants: Vec<CanonicalConstraints> = cs.iter().map(canonical).collect();
        let matcher = VariantMatcher::new(&variants);
        for p in all_params() {
            prop_assert_eq!(matcher.resolve(&p), variants.iter().position(|v| v.matches(&p)), "{}", p);
        }
    }

    #[test]
    fn coverage_agrees_with_brute_force(
        cs in prop::collection::vec(constraint(), 1..5),
        a_values in prop::collection::btree_set(prop::sample::select(vec!["1", "2", "4", "5"]), 0..4),
        a_absent in any::<bool>(),
    ) {
        let variants: Vec<CanonicalConstraints> = cs.iter().map(canonical).collect();
        // `a` has a declared domain; `b` and `c` range over everything.
        let domains: Domains = [(
            "a".to_owned(),
            KeyDomain { values: a_values.iter().map(|v| (*v).to_owned()).collect(), allow_absent: a_absent },
        )].into();
        let report = coverage(&variants, &domains, &VariantLimits::DEFAULT).unwrap();
        prop_assert!(!report.truncated);
        let in_domain = |p: &ParamSet| match p.0.get("a") {
            None => a_absent,
            Some(v) => a_values.contains(v.as_str()),
        };
        for p in all_params().into_iter().filter(in_domain) {
            let uncovered = !variants.iter().any(|v| v.matches(&p));
            let regions = report.uncovered.iter().filter(|r| in_region(&r.conditions, &p)).count();
            // Regions are disjoint and cover exactly the uncovered sets.
            prop_assert_eq!(regions, usize::from(uncovered), "{}", p);
        }
        for region in &report.uncovered {
            prop_assert!(in_domain(&region.example) || !report.keys.contains(&"a".to_owned()));
            prop_assert!(variants.iter().all(|v| !v.matches(&region.example)), "{}", region.example);
        }
    }

    #[test]
    fn xdstp_normal_form_is_idempotent_and_order_free(
        authority in "[a-z0-9.%/?#:~ -]{0,8}",
        id in "[a-z0-9/%?#:\\[\\]~ é-]{0,12}",
        params in prop::collection::btree_map("(xds\\.node\\.)?[a-z%&=#\\[\\] ]{0,4}", "[a-z0-9%&=# ]{0,4}", 0..4),
        seed in any::<u64>(),
    ) {
        prop_assume!(!id.ends_with("/*") && id != "*");
        let urn = XdstpUrn::new(authority, "envoy.config.listener.v3.Listener", id, params.clone()).unwrap();
        let normal = urn.to_string();
        prop_assert_eq!(normalize(&normal).unwrap(), normal.as_str());
        prop_assert_eq!(XdstpUrn::parse(&normal).unwrap(), urn.clone());

        // Spell the same URN with its parameters in another order: same normal form.
        let (base, query) = normal.split_once('?').unwrap_or((&normal, ""));
        let mut pairs: Vec<&str> = if query.is_empty() { vec![] } else { query.split('&').collect() };
        let mut rng = seed;
        shuffle(&mut pairs, &mut rng);
        let respelt = if pairs.is_empty() { base.to_owned() } else { format!("{base}?{}", pairs.join("&")) };
        prop_assert_eq!(normalize(&respelt).unwrap(), normal.as_str());
    }

    /// Any spelling Envoy reads (stray `%`, `&`, `=`, `*`, keys without values, repeats) parses,
    /// and its normal form is a fixed point.
    #[test]
    fn xdstp_loose_spellings_normalise_to_a_fixed_point(
        authority in "([g-z]|%|%2F|%41){0,4}",
        id in "([g-z/*]|%|%2F|%2A){0,8}",
        query in "([g-z&=*]|%|%26|%3D|%61){0,12}",
    ) {
        let name = format!("xdstp://{authority}/envoy.config.listener.v3.Listener/{id}?{query}");
        // Every such spelling parses; the globs among them (`.../*`, `.../%2A`) are not URNs.
        prop_assume!(!XdstpUrl::parse(&name).unwrap().is_glob());
        let normal = normalize(&name).unwrap().into_owned();
        prop_assert_eq!(normalize(&normal).unwrap(), normal.as_str());
        prop_assert_eq!(XdstpUrn::parse(&normal).unwrap(), XdstpUrn::parse(&name).unwrap());
    }

    /// The registry wakes a glob's streams by `collection()` and the stream machine keeps a
    /// resource by `glob_matches`; they must never disagree. Small alphabets, so that members,
    /// near-misses (a segment deeper, another context) and trailing or doubled `/` all occur.
    #[test]
    fn xdstp_glob_matches_exactly_the_collection(
        glob_authority in "[ab]",
        glob_path in "([ab]{0,1}/){0,2}",
        glob_ctx in prop::collection::btree_map("[kx]", "[12]", 0..2),
        authority in "[ab]",
        cluster in any::<bool>(),
        id in "[ab/]{0,4}",
        ctx in prop::collection::btree_map("[kx]", "[12]", 0..2),
    ) {
        let listener = "envoy.config.listener.v3.Listener";
        let glob_query: Vec<String> = glob_ctx.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let glob = format!("xdstp://{glob_authority}/{listener}/{glob_path}*?{}", glob_query.join("&"));
        let url = XdstpUrl::parse(&glob).unwrap();
        prop_assert!(url.is_glob());
        let resource_type = if cluster { "envoy.config.cluster.v3.Cluster" } else { listener };
        let urn = XdstpUrn::new(authority, resource_type, id, ctx).unwrap();

        let collection = urn.collection().unwrap();
        prop_assert!(collection.glob_matches(&urn), "{} not in {}", urn, collection);
        let member = url.glob_matches(&urn);
        prop_assert_eq!(member, collection == url, "{} in {}", urn, url);
        // The registry's key is the string; it agrees too.
        prop_assert_eq!(member, collection.to_string() == url.to_string(), "{} in {}", urn, url);
    }
}

/// 512 cases unless `PROPTEST_CASES` asks for more (or fewer).
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(512);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

fn in_region(conditions: &BTreeMap<String, KeyCondition>, p: &ParamSet) -> bool {
    conditions.iter().all(|(k, cond)| {
        let v = p.0.get(k).map(String::as_str);
        match cond {
            KeyCondition::Absent => v.is_none(),
            KeyCondition::Equals(x) => v == Some(x.as_str()),
            KeyCondition::OneOf(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
            KeyCondition::NotIn(xs) => v.is_some_and(|v| xs.iter().all(|x| x != v)),
        }
    })
}

/// Keys and values with characters that need quoting and escaping.
fn text_constraint() -> impl Strategy<Value = Constraint> {
    let key = prop_oneof![
        "[a-z][a-z0-9_./-]{0,5}",
        Just("in".to_owned()),
        Just("exists".to_owned()),
        Just("not".to_owned()),
        "[ a-zé\"\\\\()&|!=*,]{1,6}",
    ];
    let value = "[ a-z0-9é\"\\\\()&|!=*,]{0,6}";
    let leaf = prop_oneof![
        (key.clone(), value).prop_map(|(k, v)| Constraint::equals(k, v)),
        key.prop_map(Constraint::exists),
        Just(Constraint::Any),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Constraint::And),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Constraint::Or),
            inner.prop_map(Constraint::not),
        ]
    })
}

fn next(rng: &mut u64) -> u64 {
    // xorshift: deterministic per seed, enough to pick among respellings.
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

fn shuffle<T>(items: &mut [T], rng: &mut u64) {
    for i in (1..items.len()).rev() {
        items.swap(i, (next(rng) % (i as u64 + 1)) as usize);
    }
}

/// The same meaning, spelt differently in ways the canonical form must see through.
fn respell(c: &Constraint, rng: &mut u64) -> Constraint {
    let spelt = match c {
        Constraint::And(children) | Constraint::Or(children) => {
            let mut children: Vec<Constraint> = children.iter().map(|c| respell(c, rng)).collect();
            if !children.is_empty() && next(rng).is_multiple_of(3) {
                let dup = children[(next(rng) % children.len() as u64) as usize].clone();
                children.push(dup);
            }
            shuffle(&mut children, rng);
            let is_and = matches!(c, Constraint::And(_));
            // Nest a run of children in a list of the same kind.
            if children.len() >= 2 && next(rng).is_multiple_of(2) {
                let tail = children.split_off(children.len() / 2);
                children.push(if is_and {
                    Constraint::And(tail)
                } else {
                    Constraint::Or(tail)
                });
            }
            if is_and {
                Constraint::And(children)
            } else {
                Constraint::Or(children)
            }
        }
        Constraint::Not(inner) => Constraint::not(respell(inner, rng)),
        leaf => leaf.clone(),
    };
    match next(rng) % 6 {
        0 => Constraint::not(Constraint::not(spelt)),
        1 => Constraint::And(vec![spelt]),
        2 => Constraint::Or(vec![spelt, Constraint::Or(vec![])]),
        3 => Constraint::And(vec![spelt, Constraint::Any]),
        _ => spelt,
    }
}
