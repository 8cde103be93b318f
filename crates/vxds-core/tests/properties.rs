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
    check_mutual_exclusivity, coverage, validate_variant_set,
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

/// One conjunct of a generated variant, on one key, with values from a small pool so that
/// conjuncts of different variants overlap.
#[derive(Clone, Debug)]
enum Conjunct {
    Eq(u8),
    Ne(u8),
    In(u8, u8),
    NotIn(u8, u8),
    Exists,
    Absent,
}

impl Conjunct {
    fn strategy() -> impl Strategy<Value = Conjunct> {
        prop_oneof![
            (0..4u8).prop_map(Conjunct::Eq),
            (0..4u8).prop_map(Conjunct::Ne),
            (0..4u8, 0..4u8).prop_map(|(a, b)| Conjunct::In(a, b)),
            (0..4u8, 0..4u8).prop_map(|(a, b)| Conjunct::NotIn(a, b)),
            Just(Conjunct::Exists),
            Just(Conjunct::Absent),
        ]
    }

    fn constraint(&self, key: &str) -> Constraint {
        let eq = |v: &u8| Constraint::equals(key, format!("v{v}"));
        match self {
            Conjunct::Eq(v) => eq(v),
            Conjunct::Ne(v) => Constraint::not(eq(v)),
            Conjunct::In(a, b) => Constraint::Or(vec![eq(a), eq(b)]),
            Conjunct::NotIn(a, b) => Constraint::not(Constraint::Or(vec![eq(a), eq(b)])),
            Conjunct::Exists => Constraint::exists(key),
            Conjunct::Absent => Constraint::not(Constraint::exists(key)),
        }
    }

    /// A value (or absence) that satisfies the conjunct.
    fn satisfied_by(&self) -> Option<String> {
        match self {
            Conjunct::Eq(v) | Conjunct::In(v, _) => Some(format!("v{v}")),
            Conjunct::Exists => Some("v9".to_owned()),
            Conjunct::Ne(_) | Conjunct::NotIn(..) | Conjunct::Absent => None,
        }
    }
}

/// How a variant of a generated exclusive set pins the distinguishing key to its own values.
#[derive(Clone, Debug)]
enum Pin {
    Eq,
    In,
    ExistsAndEq,
}

/// An exclusive set by construction: up to 6 randomly named keys, one of which (any, so its
/// alphabetical rank varies) separates up to 256 variants, each pinning it to its own values;
/// every variant has one random conjunct on each other key. Optionally a default variant for
/// every other value of the distinguishing key (and absence).
#[derive(Clone, Debug)]
struct ExclusiveSet {
    keys: Vec<String>,
    separating: usize,
    rows: Vec<(Pin, Vec<Conjunct>)>,
    default_variant: bool,
}

impl ExclusiveSet {
    fn strategy() -> impl Strategy<Value = ExclusiveSet> {
        (
            prop::collection::btree_set("[a-z]{1,3}", 1..=6),
            any::<prop::sample::Index>(),
        )
            .prop_flat_map(|(keys, separating)| {
                let keys: Vec<String> = keys.into_iter().collect();
                let separating = separating.index(keys.len());
                let others = keys.len() - 1;
                let pin = prop_oneof![Just(Pin::Eq), Just(Pin::In), Just(Pin::ExistsAndEq)];
                let row = (pin, prop::collection::vec(Conjunct::strategy(), others));
                (
                    Just(keys),
                    Just(separating),
                    prop::collection::vec(row, 1..=256),
                    any::<bool>(),
                )
            })
            .prop_map(|(keys, separating, rows, default_variant)| ExclusiveSet {
                keys,
                separating,
                rows,
                default_variant,
            })
    }

    fn pin(&self, i: usize, pin: &Pin) -> Constraint {
        let key = &self.keys[self.separating];
        let own = Constraint::equals(key, format!("p{i}"));
        match pin {
            // The default variant lists every pinned value within 512 nodes.
            Pin::Eq => own,
            Pin::In if i >= 100 => own,
            Pin::In => Constraint::Or(vec![own, Constraint::equals(key, format!("q{i}"))]),
            Pin::ExistsAndEq => Constraint::And(vec![Constraint::exists(key), own]),
        }
    }

    /// Variant `i` with the conjuncts on the other keys given.
    fn variant(&self, i: usize, pin: &Pin, conjuncts: &[Conjunct]) -> Constraint {
        let others = self
            .keys
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != self.separating);
        let mut all = vec![self.pin(i, pin)];
        all.extend(others.zip(conjuncts).map(|((_, key), c)| c.constraint(key)));
        Constraint::And(all)
    }

    fn constraints(&self) -> Vec<Constraint> {
        let mut out: Vec<Constraint> = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, (pin, conjuncts))| self.variant(i, pin, conjuncts))
            .collect();
        if self.default_variant {
            // Every value no row pins, and absence; `exists` on each other key.
            let key = &self.keys[self.separating];
            let pinned = (0..self.rows.len())
                .flat_map(|i| {
                    [format!("p{i}"), format!("q{i}")]
                        .into_iter()
                        .take(1 + usize::from(i < 100))
                })
                .map(|v| Constraint::equals(key, v));
            let mut all = vec![Constraint::not(Constraint::Or(pinned.collect()))];
            all.extend(
                (0..self.keys.len())
                    .filter(|k| *k != self.separating)
                    .map(|k| Constraint::exists(&self.keys[k])),
            );
            out.push(Constraint::And(all));
        }
        out
    }

    /// A parameter set that matches row `i`.
    fn matching(&self, i: usize) -> ParamSet {
        let mut params = ParamSet::new();
        params.insert(self.keys[self.separating].clone(), format!("p{i}"));
        let others = self
            .keys
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != self.separating);
        for ((_, key), c) in others.zip(&self.rows[i].1) {
            if let Some(v) = c.satisfied_by() {
                params.insert(key.clone(), v);
            }
        }
        params
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

proptest! {
    // Sets of up to 256 variants: fewer cases, each does more.
    #![proptest_config(ProptestConfig { cases: config().cases.div_ceil(8), ..config() })]

    #[test]
    fn exclusive_sets_are_accepted_whatever_the_key_names(set in ExclusiveSet::strategy()) {
        let variants: Vec<CanonicalConstraints> = set.constraints().iter().map(canonical).collect();
        prop_assert_eq!(validate_variant_set(&variants, &VariantLimits::DEFAULT), Ok(()));
    }

    #[test]
    fn an_added_overlap_is_refused_with_a_witness_matching_both(
        set in ExclusiveSet::strategy(),
        target in any::<prop::sample::Index>(),
        shape in prop::collection::vec(0..4u8, 6),
    ) {
        // A new variant that matches row `j` at `p`: each key constrained in a way `p`
        // satisfies, so it overlaps `j` (and perhaps others), and is not a duplicate of `j`.
        let j = target.index(set.rows.len());
        let p = set.matching(j);
        let conjuncts: Vec<Constraint> = set.keys.iter().zip(&shape).map(|(key, shape)| {
            match (p.0.get(key), shape) {
                (Some(v), 0) => Constraint::equals(key, v),
                (Some(v), 1) => Constraint::Or(vec![Constraint::equals(key, v), Constraint::equals(key, "zz")]),
                (Some(_), 2) => Constraint::not(Constraint::equals(key, "zz")),
                (Some(_), _) => Constraint::exists(key),
                (None, 0 | 1) => Constraint::not(Constraint::exists(key)),
                (None, _) => Constraint::not(Constraint::equals(key, "zz")),
            }
        }).collect();
        let extra = canonical(&Constraint::And(conjuncts));
        prop_assert!(extra.matches(&p));
        let mut variants: Vec<CanonicalConstraints> = set.constraints().iter().map(canonical).collect();
        variants.push(extra);
        let added = variants.len() - 1;
        let errors = check_mutual_exclusivity(&variants, &VariantLimits::DEFAULT);
        prop_assert!(!errors.is_empty());
        let mut pairs = BTreeSet::new();
        for e in &errors {
            match e {
                VariantSetError::Overlap { first, second, witness } => {
                    prop_assert!(variants[*first].matches(witness), "{} misses {}", witness, first);
                    prop_assert!(variants[*second].matches(witness), "{} misses {}", witness, second);
                    // The generated set is exclusive: every overlap involves the new variant.
                    prop_assert_eq!(*second, added);
                    pairs.insert((*first, *second));
                }
                VariantSetError::DuplicateVariant { first, second, witness, .. } => {
                    prop_assert_eq!(*second, added);
                    let witness = witness.as_ref().unwrap();
                    prop_assert!(variants[*first].matches(witness));
                    pairs.insert((*first, *second));
                }
                other => prop_assert!(false, "unexpected {}", other),
            }
        }
        prop_assert!(pairs.contains(&(j, added)), "{:?}", errors);
        // Exactly the rows the new variant overlaps, by their own witnesses.
        for (i, row) in (0..set.rows.len()).map(|i| (i, set.matching(i))) {
            if variants[added].matches(&row) {
                prop_assert!(pairs.contains(&(i, added)), "{} overlaps at {}", i, row);
            }
        }
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
