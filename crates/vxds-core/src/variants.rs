//! The rules a resource's variant set obeys (TP2), the coverage report, and the matcher.
//!
//! One function per rule, called alike by the store, the REST API, the CLI and fixture loading:
//! - [`check_limits`]: how many variants and distinct keys one resource may have;
//! - [`check_same_key_set`]: every variant constrains the same set of keys;
//! - [`check_mutual_exclusivity`]: no parameter set matches two variants (exact, with witness);
//!
//! [`validate_variant_set`] runs them all and reports every error. [`never_matching`] finds
//! variants no client can ever receive (a warning), [`coverage`] reports which parameter sets
//! match no variant, [`coverage_grid`] shows every combination of the values the variants
//! mention with the variant it gets, and [`VariantMatcher`] resolves subscribers.
//!
//! Variants are identified by their position in the slice and their canonical id.
//!
//! The analyses are exact and bounded: each spends at most [`VariantLimits::analysis_budget`]
//! steps, a step being about constant work (one expression node evaluated, one requirement
//! compared), and refuses with [`VariantSetError::TooComplex`] rather than guess.

mod compiled;
mod coverage;
mod exclusivity;
mod grid;
mod matcher;

use std::collections::{BTreeMap, BTreeSet};

pub use coverage::{CoverageReport, Domains, KeyCondition, KeyDomain, UncoveredRegion};
pub use grid::{CoverageGrid, GridCell, GridError, GridKey, GridValue, MAX_CELLS, coverage_grid};
pub use matcher::VariantMatcher;

use crate::constraints::{CanonicalConstraints, ConstraintsId};
use crate::params::ParamSet;
use compiled::{Budget, Compiled};

/// Limits on one resource's variant set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VariantLimits {
    pub max_variants: usize,
    /// Distinct keys across all variants (at most 64).
    pub max_keys: usize,
    /// Steps the exclusivity analysis (and [`never_matching`], [`coverage`]) may take before it
    /// gives up and refuses. A step is about constant work: one expression node evaluated (each
    /// evaluation is charged its expression's full size), one requirement compared when
    /// pruning pairs of variants, one (variant, key) scored when choosing a key to split on. So
    /// the budget bounds CPU whatever the shape of the expressions.
    pub analysis_budget: u64,
}

impl VariantLimits {
    pub const DEFAULT: VariantLimits = VariantLimits {
        max_variants: 1024,
        max_keys: 32,
        analysis_budget: 4_000_000,
    };
}

impl Default for VariantLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A broken variant-set rule. Variant numbers are positions in the set, from 0.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum VariantSetError {
    #[error("{count} variants exceed the limit of {limit} per resource")]
    TooManyVariants { count: usize, limit: usize },
    #[error("the variants constrain {count} distinct keys; the limit is {limit}")]
    TooManyKeys { count: usize, limit: usize },
    #[error(
        "variant {second} has the same constraints as variant {first} (id {id}){}",
        match (witness, never_matches) {
            (Some(w), _) => format!(": both match {w}"),
            (None, true) => ", which no parameter set can match".to_owned(),
            (None, false) => String::new(),
        }
    )]
    DuplicateVariant {
        first: usize,
        second: usize,
        id: ConstraintsId,
        /// A parameter set both match; `None` when none does (`never_matches`), or when the
        /// analysis ran out of budget looking for one.
        #[serde(skip_serializing_if = "Option::is_none")]
        witness: Option<ParamSet>,
        /// No parameter set matches the constraints at all: there is no witness to give.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        never_matches: bool,
    },
    #[error(
        "variant {variant} constrains keys {} but variant {reference} constrains {}{}{}",
        KeyList(own), KeyList(reference_keys),
        if missing.is_empty() { String::new() } else { format!("; missing {}", KeyList(missing)) },
        if extra.is_empty() { String::new() } else { format!("; extra {}", KeyList(extra)) }
    )]
    KeySetMismatch {
        variant: usize,
        reference: usize,
        own: Vec<String>,
        reference_keys: Vec<String>,
        /// Keys the reference constrains and this variant does not.
        missing: Vec<String>,
        /// Keys this variant constrains and the reference does not.
        extra: Vec<String>,
    },
    #[error("variants {first} and {second} overlap: both match {witness}")]
    Overlap {
        first: usize,
        second: usize,
        witness: ParamSet,
    },
    #[error(
        "the variants are too complex to prove mutually exclusive within {budget} evaluation \
         steps; simplify their constraints"
    )]
    TooComplex { budget: u64 },
}

impl VariantSetError {
    /// A stable, machine-readable code for API error lists.
    pub fn code(&self) -> &'static str {
        match self {
            VariantSetError::TooManyVariants { .. } => "too_many_variants",
            VariantSetError::TooManyKeys { .. } => "too_many_keys",
            VariantSetError::DuplicateVariant { .. } => "duplicate_variant",
            VariantSetError::KeySetMismatch { .. } => "key_set_mismatch",
            VariantSetError::Overlap { .. } => "overlapping_variants",
            VariantSetError::TooComplex { .. } => "too_complex",
        }
    }

    /// The variant the error is best reported against, if it is about one.
    pub fn variant(&self) -> Option<usize> {
        match self {
            VariantSetError::DuplicateVariant { second, .. } => Some(*second),
            VariantSetError::KeySetMismatch { variant, .. } => Some(*variant),
            VariantSetError::Overlap { second, .. } => Some(*second),
            _ => None,
        }
    }

    /// The witness parameter set, for overlaps and duplicates.
    pub fn witness(&self) -> Option<&ParamSet> {
        match self {
            VariantSetError::Overlap { witness, .. } => Some(witness),
            VariantSetError::DuplicateVariant { witness, .. } => witness.as_ref(),
            _ => None,
        }
    }
}

struct KeyList<'a>(&'a [String]);

impl std::fmt::Display for KeyList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{{}}}", self.0.join(", "))
    }
}

/// All rules; `Err` lists every broken one. The exclusivity analysis only runs when the set is
/// within its limits.
pub fn validate_variant_set(
    variants: &[CanonicalConstraints],
    limits: &VariantLimits,
) -> Result<(), Vec<VariantSetError>> {
    let mut errors = check_limits(variants, limits);
    errors.extend(check_same_key_set(variants));
    if !errors.iter().any(|e| {
        matches!(
            e,
            VariantSetError::TooManyVariants { .. } | VariantSetError::TooManyKeys { .. }
        )
    }) {
        errors.extend(check_mutual_exclusivity(variants, limits));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// The number of variants and of distinct keys stay within `limits`.
pub fn check_limits(
    variants: &[CanonicalConstraints],
    limits: &VariantLimits,
) -> Vec<VariantSetError> {
    let mut errors = Vec::new();
    if variants.len() > limits.max_variants {
        errors.push(VariantSetError::TooManyVariants {
            count: variants.len(),
            limit: limits.max_variants,
        });
    }
    let keys: BTreeSet<&str> = variants.iter().flat_map(|v| v.keys()).collect();
    let max_keys = limits.max_keys.min(compiled::MAX_KEYS);
    if keys.len() > max_keys {
        errors.push(VariantSetError::TooManyKeys {
            count: keys.len(),
            limit: max_keys,
        });
    }
    errors
}

/// Every variant constrains the same set of keys (TP2's best practice, which keeps a client
/// that sends an extra key from matching two variants).
///
/// The keys are those the constraints were written with
/// ([`CanonicalConstraints::written_keys`]), so a branch constant folding removes (`v = "1" ||
/// *`) still counts, and the error names the keys the operator wrote.
///
/// The reference is the key set most variants share (the earliest on a tie); each variant that
/// differs is reported once, against the first variant with the reference set.
pub fn check_same_key_set(variants: &[CanonicalConstraints]) -> Vec<VariantSetError> {
    let key_sets: Vec<BTreeSet<&str>> = variants.iter().map(|v| v.written_keys()).collect();
    let mut tally: BTreeMap<&BTreeSet<&str>, (usize, usize)> = BTreeMap::new();
    for (i, keys) in key_sets.iter().enumerate() {
        tally.entry(keys).or_insert((0, i)).0 += 1;
    }
    let Some((reference_set, (_, reference))) = tally
        .iter()
        .max_by_key(|(_, (count, first))| (*count, std::cmp::Reverse(*first)))
        .map(|(set, tally)| (*set, *tally))
    else {
        return Vec::new();
    };
    let to_vec = |set: &mut dyn Iterator<Item = &&str>| set.map(|k| (*k).to_owned()).collect();
    key_sets
        .iter()
        .enumerate()
        .filter(|(_, keys)| *keys != reference_set)
        .map(|(variant, keys)| VariantSetError::KeySetMismatch {
            variant,
            reference,
            own: to_vec(&mut keys.iter()),
            reference_keys: to_vec(&mut reference_set.iter()),
            missing: to_vec(&mut reference_set.difference(keys)),
            extra: to_vec(&mut keys.difference(reference_set)),
        })
        .collect()
}

/// No parameter set matches two variants. Exact for any AND/OR/NOT nesting; each overlapping
/// pair is reported once with a witness that matches both. Identical variants are reported as
/// duplicates instead, with a witness too when they match anything.
///
/// The analysis spends at most `limits.analysis_budget` steps (see [`VariantLimits`]); a set it
/// cannot decide within them is refused as [`VariantSetError::TooComplex`].
pub fn check_mutual_exclusivity(
    variants: &[CanonicalConstraints],
    limits: &VariantLimits,
) -> Vec<VariantSetError> {
    let mut errors = Vec::new();
    // Identical constraints are one identity twice; analyse each identity once.
    let mut first_with_id: BTreeMap<ConstraintsId, (usize, usize)> = BTreeMap::new();
    let mut distinct = Vec::with_capacity(variants.len());
    // (first, second, index of the identity among the distinct variants)
    let mut duplicates = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        match first_with_id.get(&variant.id()) {
            Some(&(first, d)) => duplicates.push((first, i, d)),
            None => {
                first_with_id.insert(variant.id(), (i, distinct.len()));
                distinct.push(i);
            }
        }
    }
    let refs: Vec<&CanonicalConstraints> = distinct.iter().map(|&i| &variants[i]).collect();
    let compiled = compile(&refs);
    let mut budget = Budget::new(limits.analysis_budget);
    let overlaps = compiled
        .as_ref()
        .map(|compiled| exclusivity::find_overlaps(compiled, &mut budget));
    // A witness for each duplicate from what budget is left: the set is refused either way.
    errors.extend(duplicates.into_iter().map(|(first, second, d)| {
        let found = compiled
            .as_ref()
            .ok()
            .and_then(|c| exclusivity::satisfying(c, d, &mut budget).ok());
        VariantSetError::DuplicateVariant {
            first,
            second,
            id: variants[second].id(),
            // Decided and nothing found: the constraints contradict themselves.
            never_matches: matches!(found, Some(None)),
            witness: found.flatten(),
        }
    }));
    match overlaps {
        Err(e) => errors.push(e.clone()),
        Ok(Ok(overlaps)) => errors.extend(overlaps.into_iter().map(|o| VariantSetError::Overlap {
            first: distinct[o.first],
            second: distinct[o.second],
            witness: o.witness,
        })),
        Ok(Err(_)) => errors.push(VariantSetError::TooComplex {
            budget: budget.limit,
        }),
    }
    errors
}

/// Variants that no parameter set matches, e.g. `env = "a" && env = "b"`: legal, but almost
/// certainly a mistake. `Err` carries the budget when the analysis gave up.
pub fn never_matching(
    variants: &[CanonicalConstraints],
    limits: &VariantLimits,
) -> Result<Vec<usize>, VariantSetError> {
    let compiled = compile(&variants.iter().collect::<Vec<_>>())?;
    let mut budget = Budget::new(limits.analysis_budget);
    let mut dead = Vec::new();
    for v in 0..variants.len() {
        let satisfiable = exclusivity::is_satisfiable(&compiled, v, &mut budget).map_err(|_| {
            VariantSetError::TooComplex {
                budget: budget.limit,
            }
        })?;
        if !satisfiable {
            dead.push(v);
        }
    }
    Ok(dead)
}

/// Which parameter sets within `domains` match no variant.
pub fn coverage(
    variants: &[CanonicalConstraints],
    domains: &Domains,
    limits: &VariantLimits,
) -> Result<CoverageReport, VariantSetError> {
    let compiled = compile(&variants.iter().collect::<Vec<_>>())?;
    let mut budget = Budget::new(limits.analysis_budget);
    coverage::report(&compiled, domains, &mut budget).map_err(|_| VariantSetError::TooComplex {
        budget: budget.limit,
    })
}

fn compile(variants: &[&CanonicalConstraints]) -> Result<Compiled, VariantSetError> {
    Compiled::new(variants).ok_or_else(|| {
        let keys: BTreeSet<&str> = variants.iter().flat_map(|v| v.keys()).collect();
        VariantSetError::TooManyKeys {
            count: keys.len(),
            limit: compiled::MAX_KEYS,
        }
    })
}
