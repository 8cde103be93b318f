//! The mutual-exclusivity decision: does any parameter set match two variants?
//!
//! Exact for arbitrary AND/OR/NOT nesting. The search assigns one key at a time to each of its
//! value classes (see [`compiled`](super::compiled)), keeping only the variants not yet false.
//! A branch with fewer than two live variants cannot hold an overlap and is cut; two variants
//! that are true under a partial assignment overlap for every completion of it, so the
//! assignment (unassigned keys absent) is a witness. Since every key is eventually assigned,
//! nothing is missed; since Kleene truth is sound, nothing is invented.

use std::collections::BTreeMap;

use super::compiled::{Budget, BudgetExceeded, Compiled, Truth};
use crate::params::ParamSet;

/// Two variants that both match `witness`. Indices are into the compiled variants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Overlap {
    pub first: usize,
    pub second: usize,
    pub witness: ParamSet,
}

/// Every overlapping pair, each with one witness, ordered by pair.
pub(crate) fn find_overlaps(
    compiled: &Compiled,
    budget: &mut Budget,
) -> Result<Vec<Overlap>, BudgetExceeded> {
    let mut search = Search {
        compiled,
        assignment: vec![None; compiled.key_count()],
        found: BTreeMap::new(),
        budget,
    };
    let all: Vec<usize> = (0..compiled.exprs.len()).collect();
    search.visit(&all)?;
    Ok(search
        .found
        .into_iter()
        .map(|((first, second), witness)| Overlap {
            first,
            second,
            witness,
        })
        .collect())
}

/// Whether some parameter set matches `variant` at all.
pub(crate) fn is_satisfiable(
    compiled: &Compiled,
    variant: usize,
    budget: &mut Budget,
) -> Result<bool, BudgetExceeded> {
    fn visit(
        compiled: &Compiled,
        variant: usize,
        assignment: &mut Vec<Option<u32>>,
        budget: &mut Budget,
    ) -> Result<bool, BudgetExceeded> {
        budget.spend(1)?;
        match compiled.eval(variant, assignment) {
            Truth::True => return Ok(true),
            Truth::False => return Ok(false),
            Truth::Unknown => {}
        }
        let Some(key) = compiled.pick_split_key([variant].into_iter(), assignment) else {
            return Ok(false);
        };
        for class in compiled.classes_in_search_order(key) {
            assignment[key] = Some(class);
            if visit(compiled, variant, assignment, budget)? {
                assignment[key] = None;
                return Ok(true);
            }
        }
        assignment[key] = None;
        Ok(false)
    }
    let mut assignment = vec![None; compiled.key_count()];
    visit(compiled, variant, &mut assignment, budget)
}

struct Search<'a> {
    compiled: &'a Compiled,
    assignment: Vec<Option<u32>>,
    found: BTreeMap<(usize, usize), ParamSet>,
    budget: &'a mut Budget,
}

impl Search<'_> {
    fn visit(&mut self, candidates: &[usize]) -> Result<(), BudgetExceeded> {
        let mut alive = Vec::with_capacity(candidates.len());
        let mut trues = Vec::new();
        let mut unknown = 0usize;
        self.budget.spend(candidates.len() as u64)?;
        for &v in candidates {
            match self.compiled.eval(v, &self.assignment) {
                Truth::False => {}
                Truth::True => {
                    alive.push(v);
                    trues.push(v);
                }
                Truth::Unknown => {
                    alive.push(v);
                    unknown += 1;
                }
            }
        }
        if alive.len() < 2 {
            return Ok(());
        }
        if trues.len() >= 2 {
            let mut witness = None;
            for (i, &a) in trues.iter().enumerate() {
                for &b in &trues[i + 1..] {
                    if !self.found.contains_key(&(a, b)) {
                        let w =
                            witness.get_or_insert_with(|| self.compiled.witness(&self.assignment));
                        self.found.insert((a, b), w.clone());
                    }
                }
            }
        }
        if unknown == 0 || self.all_pairs_known(&alive) {
            return Ok(());
        }
        let undecided = alive
            .iter()
            .copied()
            .filter(|&v| self.compiled.eval(v, &self.assignment) == Truth::Unknown);
        let Some(key) = self.compiled.pick_split_key(undecided, &self.assignment) else {
            return Ok(());
        };
        for class in self.compiled.classes_in_search_order(key) {
            self.assignment[key] = Some(class);
            self.visit(&alive)?;
        }
        self.assignment[key] = None;
        Ok(())
    }

    /// Nothing new can be learnt below once every live pair is already known to overlap.
    fn all_pairs_known(&self, alive: &[usize]) -> bool {
        if self.found.is_empty() {
            return false;
        }
        alive.iter().enumerate().all(|(i, &a)| {
            alive[i + 1..]
                .iter()
                .all(|&b| self.found.contains_key(&(a, b)))
        })
    }
}
