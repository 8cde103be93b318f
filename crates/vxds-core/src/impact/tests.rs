//! The impact computation: examples for each kind of move, and properties against a
//! brute-force first-match evaluation.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use proptest::prelude::*;

use super::*;
use crate::constraints::{Constraint, Constraints, Limits};
use crate::params::ParamSet;

fn v(text: &str, version: &str) -> VariantState {
    VariantState {
        constraints: Constraints::parse(text, &Limits::DEFAULT)
            .unwrap()
            .canonical(),
        version: version.to_owned(),
    }
}

fn g(pairs: &[(&str, &str)], streams: u64, nodes: &[&str]) -> Group {
    Group {
        params: pairs.iter().copied().collect(),
        streams,
        sample_nodes: nodes.iter().map(|n| n.to_string()).collect(),
    }
}

/// A move between variants written in the text syntax (compared in canonical form).
fn mv(kind: MoveKind, from: Option<&str>, to: Option<&str>, streams: u64, nodes: &[&str]) -> Move {
    let canonical = |t: &str| v(t, "").constraints.to_string();
    Move {
        kind,
        from: from.map(canonical),
        to: to.map(canonical),
        streams,
        sample_nodes: nodes.iter().map(|n| n.to_string()).collect(),
    }
}

#[test]
fn a_narrowed_variant_switches_its_clients_and_loses_others() {
    // Before: prod and everything else. After: prod, and test only.
    let before = [v("env = prod", "p1"), v("env != prod", "o1")];
    let after = [v("env = prod", "p1"), v("env = test", "t1")];
    let groups = [
        g(&[("env", "prod")], 5, &["p-a", "p-b"]),
        g(&[("env", "test")], 3, &["t-a"]),
        g(&[("env", "dev")], 2, &["d-a"]),
        g(&[], 1, &["none"]),
    ];
    let impact = resource_impact(&before, &after, &groups);
    assert_eq!(impact.streams, 11);
    assert_eq!(impact.unchanged, 5);
    assert_eq!(impact.unmatched, 0);
    assert_eq!(
        impact.moves,
        [
            mv(
                MoveKind::Switch,
                Some("env != prod"),
                Some("env = test"),
                3,
                &["t-a"]
            ),
            mv(
                MoveKind::Lose,
                Some("env != prod"),
                None,
                3,
                &["d-a", "none"]
            ),
        ]
    );
    assert_eq!(impact.affected(), 6);
}

#[test]
fn a_new_body_updates_only_the_clients_of_that_variant() {
    let before = [v("env = prod", "p1"), v("env != prod", "o1")];
    let after = [v("env = prod", "p2"), v("env != prod", "o1")];
    let groups = [
        g(&[("env", "prod")], 4, &["p"]),
        g(&[("env", "dev")], 6, &["d"]),
    ];
    let impact = resource_impact(&before, &after, &groups);
    assert_eq!(
        impact.moves,
        [mv(
            MoveKind::Update,
            Some("env = prod"),
            Some("env = prod"),
            4,
            &["p"]
        )]
    );
    assert_eq!(impact.unchanged, 6);
}

#[test]
fn creating_a_resource_gains_its_waiting_subscribers() {
    let after = [v("version = v2", "a")];
    let groups = [
        g(&[("version", "v2")], 2, &["n2", "n1"]),
        g(&[("version", "v1")], 7, &["old"]),
    ];
    let impact = resource_impact(&[], &after, &groups);
    assert_eq!(
        impact.moves,
        [mv(
            MoveKind::Gain,
            None,
            Some("version = v2"),
            2,
            &["n1", "n2"]
        )]
    );
    assert_eq!(impact.unmatched, 7);
}

#[test]
fn deleting_a_resource_loses_every_matched_client() {
    let before = [v("*", "a")];
    let groups = [g(&[("x", "1")], 2, &["a"]), g(&[], 3, &["b"])];
    let impact = resource_impact(&before, &[], &groups);
    assert_eq!(
        impact.moves,
        [mv(MoveKind::Lose, Some("*"), None, 5, &["a", "b"])]
    );
}

#[test]
fn nobody_subscribed_means_no_impact() {
    let impact = resource_impact(&[v("*", "a")], &[v("*", "b")], &[]);
    assert_eq!(impact, ResourceImpact::default());
}

#[test]
fn samples_are_capped_and_merged_across_groups() {
    let before = [v("*", "a")];
    let after = [v("*", "b")];
    let groups = [
        g(&[("k", "1")], 1, &["z"]),
        g(&[("k", "2")], 1, &["c", "y"]),
        g(&[("k", "3")], 1, &["b", "a"]),
    ];
    let impact = resource_impact(&before, &after, &groups);
    assert_eq!(impact.moves.len(), 1);
    assert_eq!(impact.moves[0].streams, 3);
    assert_eq!(impact.moves[0].sample_nodes, ["a", "b", "c"]);
}

// ---- properties --------------------------------------------------------------------------

const KEYS: [&str; 2] = ["a", "b"];
const VALUES: [&str; 2] = ["1", "2"];

fn constraint() -> impl Strategy<Value = Constraint> {
    let leaf = prop_oneof![
        4 => (prop::sample::select(&KEYS[..]), prop::sample::select(&VALUES[..]))
            .prop_map(|(k, v)| Constraint::equals(k, v)),
        2 => prop::sample::select(&KEYS[..]).prop_map(Constraint::exists),
        1 => Just(Constraint::Any),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Constraint::And),
            prop::collection::vec(inner.clone(), 0..3).prop_map(Constraint::Or),
            inner.prop_map(Constraint::not),
        ]
    })
}

/// A variant set (possibly overlapping: first match wins, as in the matcher), with versions
/// from a small pool so that bodies sometimes stay and sometimes change.
fn variant_set() -> impl Strategy<Value = Vec<VariantState>> {
    prop::collection::vec((constraint(), 0..2u8), 0..4).prop_map(|vs| {
        vs.into_iter()
            .map(|(c, version)| VariantState {
                constraints: Constraints::new(c, &Limits::DEFAULT).unwrap().canonical(),
                version: version.to_string(),
            })
            .collect()
    })
}

fn params() -> impl Strategy<Value = ParamSet> {
    let value = prop_oneof![
        Just(None),
        Just(Some("1")),
        Just(Some("2")),
        Just(Some("3"))
    ];
    (value.clone(), value).prop_map(|(a, b)| {
        let mut p = ParamSet::new();
        if let Some(a) = a {
            p.insert("a", a);
        }
        if let Some(b) = b {
            p.insert("b", b);
        }
        p
    })
}

fn groups() -> impl Strategy<Value = Vec<Group>> {
    prop::collection::btree_map(params(), (1..5u64, "[a-e]"), 0..6).prop_map(|m| {
        m.into_iter()
            .map(|(params, (streams, node))| Group {
                params,
                streams,
                sample_nodes: vec![node],
            })
            .collect()
    })
}

/// The first variant that matches, by evaluating each in order.
fn first_match<'a>(set: &'a [VariantState], params: &ParamSet) -> Option<&'a VariantState> {
    set.iter().find(|v| v.constraints.matches(params))
}

proptest! {
    #[test]
    fn every_stream_is_counted_once(before in variant_set(), after in variant_set(), groups in groups()) {
        let impact = resource_impact(&before, &after, &groups);
        let total: u64 = groups.iter().map(|g| g.streams).sum();
        prop_assert_eq!(impact.streams, total);
        prop_assert_eq!(impact.affected() + impact.unchanged + impact.unmatched, total);
        for m in &impact.moves {
            prop_assert!(m.streams > 0);
            prop_assert!(m.sample_nodes.len() <= SAMPLE_NODES);
        }
    }

    #[test]
    fn each_group_moves_as_brute_force_says(before in variant_set(), after in variant_set(), groups in groups()) {
        let impact = resource_impact(&before, &after, &groups);
        for group in &groups {
            let alone = resource_impact(&before, &after, std::slice::from_ref(group));
            let was = first_match(&before, &group.params);
            let will = first_match(&after, &group.params);
            let text = |v: &VariantState| v.constraints.to_string();
            let expected = match (was, will) {
                (None, None) => None,
                (Some(a), Some(b)) if a.constraints != b.constraints => Some(MoveKind::Switch),
                (Some(a), Some(b)) if a.version != b.version => Some(MoveKind::Update),
                (Some(_), Some(_)) => None,
                (Some(_), None) => Some(MoveKind::Lose),
                (None, Some(_)) => Some(MoveKind::Gain),
            };
            match expected {
                None => prop_assert!(alone.moves.is_empty()),
                Some(kind) => {
                    prop_assert_eq!(alone.moves.len(), 1);
                    let m = &alone.moves[0];
                    prop_assert_eq!(m.kind, kind);
                    prop_assert_eq!(&m.from, &was.map(text));
                    prop_assert_eq!(&m.to, &will.map(text));
                    // And the group is inside the combined impact's move of that kind.
                    let combined = impact.moves.iter().find(|c| c.kind == m.kind && c.from == m.from && c.to == m.to);
                    prop_assert!(combined.is_some_and(|c| c.streams >= group.streams));
                }
            }
        }
    }

    #[test]
    fn an_unchanged_set_moves_nobody(set in variant_set(), groups in groups()) {
        let impact = resource_impact(&set, &set, &groups);
        prop_assert!(impact.moves.is_empty());
    }

    #[test]
    fn reversing_a_change_reverses_its_moves(before in variant_set(), after in variant_set(), groups in groups()) {
        let forward = resource_impact(&before, &after, &groups);
        let backward = resource_impact(&after, &before, &groups);
        let reversed = |m: &Move| {
            let kind = match m.kind {
                MoveKind::Gain => MoveKind::Lose,
                MoveKind::Lose => MoveKind::Gain,
                k => k,
            };
            (kind, m.to.clone(), m.from.clone(), m.streams)
        };
        let mut expected: Vec<_> = forward.moves.iter().map(reversed).collect();
        expected.sort();
        let mut got: Vec<_> = backward.moves.iter().map(|m| (m.kind, m.from.clone(), m.to.clone(), m.streams)).collect();
        got.sort();
        prop_assert_eq!(got, expected);
        prop_assert_eq!(forward.unchanged, backward.unchanged);
    }
}
