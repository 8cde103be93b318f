//! The mutual-exclusivity decision: does any parameter set match two variants?
//!
//! Exact for arbitrary AND/OR/NOT nesting, in two phases.
//!
//! 1. **Pruning.** For every variant and key, a static over-approximation of the classes (see
//!    [`compiled`](super::compiled)) under which the variant can be true: `env = "a"` can only
//!    be true for the class of `a`, `!exists(v)` only for absence, `k in (...)` for its values,
//!    and AND/OR/NOT combine them (intersection, union, and the dual "can be false" sets). Two
//!    variants whose sets for one key do not intersect cannot overlap; the pair is dropped
//!    without searching. The check is O(n²) in the variants, each comparison charged to the
//!    budget. Typical sets (every variant pins some key to its own value, or a table of
//!    `=` and `not in` cells) are decided here entirely.
//! 2. **Search**, over the pairs left. The search assigns one key at a time to each of its
//!    value classes, keeping only the variants not yet false that still have a live partner
//!    (a pair neither pruned nor already found overlapping); a branch without such a pair is
//!    cut. Two variants that are true under a partial assignment overlap for every completion
//!    of it, so the assignment (unassigned keys absent) is a witness. The key split on is the
//!    one that minimises the live variants summed over its classes (from the pruning sets), so
//!    a key that separates the variants is split on first whatever its name. Since every key is
//!    eventually assigned, nothing is missed; since Kleene truth is sound, nothing is invented.
//!
//! Every phase charges the [`Budget`] by the work it does (see there), so the budget bounds the
//! CPU the analysis may take.

use std::collections::BTreeMap;

use super::compiled::{ABSENT, Budget, BudgetExceeded, Compiled, Expr, Truth};
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
    let n = compiled.exprs.len();
    let live = LiveClasses::new(compiled, budget)?;
    let words = n.div_ceil(64);
    // Bit (a, b): the pair may overlap and no overlap has been found yet.
    let mut open = vec![0u64; n * words];
    for a in 0..n {
        let mut steps = 0;
        for b in a + 1..n {
            if !live.disjoint(a, b, &mut steps) {
                open[a * words + b / 64] |= 1 << (b % 64);
                open[b * words + a / 64] |= 1 << (a % 64);
            }
        }
        budget.spend(steps)?;
    }
    let candidates: Vec<usize> = (0..n)
        .filter(|&v| open[v * words..(v + 1) * words].iter().any(|w| *w != 0))
        .collect();
    let mut search = Search {
        compiled,
        live: &live,
        assignment: vec![None; compiled.key_count()],
        found: BTreeMap::new(),
        open,
        words,
        budget,
    };
    search.visit(&candidates)?;
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
    Ok(satisfying(compiled, variant, budget)?.is_some())
}

/// A parameter set that matches `variant`, if there is one.
pub(crate) fn satisfying(
    compiled: &Compiled,
    variant: usize,
    budget: &mut Budget,
) -> Result<Option<ParamSet>, BudgetExceeded> {
    fn visit(
        compiled: &Compiled,
        variant: usize,
        assignment: &mut Vec<Option<u32>>,
        budget: &mut Budget,
    ) -> Result<bool, BudgetExceeded> {
        budget.spend(compiled.sizes[variant])?;
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
                return Ok(true);
            }
        }
        assignment[key] = None;
        Ok(false)
    }
    let mut assignment = vec![None; compiled.key_count()];
    Ok(visit(compiled, variant, &mut assignment, budget)?.then(|| compiled.witness(&assignment)))
}

/// A set of classes of one key: only these, or all but these. Lists are sorted. `Except` never
/// lists [`OTHER`](super::compiled::OTHER) (no constraint names it), so two `Except` sets
/// always intersect.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Classes {
    Only(Vec<u32>),
    Except(Vec<u32>),
}

impl Classes {
    const ALL: Classes = Classes::Except(Vec::new());

    fn is_all(&self) -> bool {
        matches!(self, Classes::Except(x) if x.is_empty())
    }

    fn len(&self) -> usize {
        match self {
            Classes::Only(x) | Classes::Except(x) => x.len(),
        }
    }

    fn union(&self, other: &Classes) -> Classes {
        match (self, other) {
            (Classes::Only(a), Classes::Only(b)) => Classes::Only(merge(a, b, |x, y| x || y)),
            (Classes::Only(a), Classes::Except(b)) | (Classes::Except(b), Classes::Only(a)) => {
                Classes::Except(merge(b, a, |x, y| x && !y))
            }
            (Classes::Except(a), Classes::Except(b)) => Classes::Except(merge(a, b, |x, y| x && y)),
        }
    }

    fn intersection(&self, other: &Classes) -> Classes {
        match (self, other) {
            (Classes::Only(a), Classes::Only(b)) => Classes::Only(merge(a, b, |x, y| x && y)),
            (Classes::Only(a), Classes::Except(b)) | (Classes::Except(b), Classes::Only(a)) => {
                Classes::Only(merge(a, b, |x, y| x && !y))
            }
            (Classes::Except(a), Classes::Except(b)) => Classes::Except(merge(a, b, |x, y| x || y)),
        }
    }

    /// Whether no class is in both; `steps` counts the list elements looked at.
    fn disjoint(&self, other: &Classes, steps: &mut u64) -> bool {
        let (only, other, subset) = match (self, other) {
            (Classes::Except(_), Classes::Except(_)) => return false,
            (Classes::Only(a), Classes::Only(b)) => (a, b, false),
            (Classes::Only(a), Classes::Except(b)) | (Classes::Except(b), Classes::Only(a)) => {
                (a, b, true)
            }
        };
        // Disjoint from `Only(b)`: no element in `b`; from `Except(b)`: every element in `b`.
        let (mut i, mut j) = (0, 0);
        while i < only.len() {
            *steps += 1;
            if j == other.len() || only[i] < other[j] {
                if subset {
                    return false;
                }
                i += 1;
            } else if only[i] > other[j] {
                j += 1;
            } else {
                if !subset {
                    return false;
                }
                i += 1;
                j += 1;
            }
        }
        true
    }
}

/// The sorted elements `x` of `a ∪ b` with `keep(x ∈ a, x ∈ b)`.
fn merge(a: &[u32], b: &[u32], keep: impl Fn(bool, bool) -> bool) -> Vec<u32> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let (x, in_a, in_b) = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) if x == y => (x, true, true),
            (Some(&x), Some(&y)) if x < y => (x, true, false),
            (Some(&x), None) => (x, true, false),
            (_, Some(&y)) => (y, false, true),
            (None, None) => break,
        };
        if in_a {
            i += 1;
        }
        if in_b {
            j += 1;
        }
        if keep(in_a, in_b) {
            out.push(x);
        }
    }
    out
}

/// For one key: the classes under which an expression can be true, and those under which it
/// can be false (sound over-approximations; a key an expression does not mention is `ALL`).
#[derive(Clone, Debug)]
struct KeyTruth {
    can_be_true: Classes,
    can_be_false: Classes,
}

/// Per variant, the classes of each key under which it can be true (pruning and split choice).
struct LiveClasses {
    /// Per variant, sorted by key; keys whose set is every class are left out.
    sets: Vec<Vec<(u16, Classes)>>,
    /// Per variant and key (`v * keys + k`), how many classes the variant can be true in.
    counts: Vec<u32>,
    keys: usize,
}

impl LiveClasses {
    fn new(compiled: &Compiled, budget: &mut Budget) -> Result<Self, BudgetExceeded> {
        let keys = compiled.key_count();
        let mut sets = Vec::with_capacity(compiled.exprs.len());
        let mut counts = Vec::with_capacity(compiled.exprs.len() * keys);
        for expr in &compiled.exprs {
            let mut steps = 0;
            let truths = key_truths(expr, &mut steps);
            budget.spend(steps)?;
            let set: Vec<(u16, Classes)> = truths
                .into_iter()
                .filter(|(_, t)| !t.can_be_true.is_all())
                .map(|(k, t)| (k, t.can_be_true))
                .collect();
            let start = counts.len();
            counts.extend((0..keys).map(|k| compiled.class_count(k)));
            for (k, classes) in &set {
                let all = compiled.class_count(*k as usize);
                counts[start + *k as usize] = match classes {
                    Classes::Only(x) => x.len() as u32,
                    Classes::Except(x) => all - x.len() as u32,
                };
            }
            sets.push(set);
        }
        Ok(Self { sets, counts, keys })
    }

    /// Whether some key separates the two variants; `steps` counts the work.
    fn disjoint(&self, a: usize, b: usize, steps: &mut u64) -> bool {
        let (a, b) = (&self.sets[a], &self.sets[b]);
        let (mut i, mut j) = (0, 0);
        *steps += 1;
        while i < a.len() && j < b.len() {
            *steps += 1;
            match a[i].0.cmp(&b[j].0) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    if a[i].1.disjoint(&b[j].1, steps) {
                        return true;
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        false
    }

    fn count(&self, variant: usize, key: usize) -> u64 {
        u64::from(self.counts[variant * self.keys + key])
    }
}

/// Per mentioned key, sorted, what [`KeyTruth`] says about `expr`; `steps` counts the work.
fn key_truths(expr: &Expr, steps: &mut u64) -> Vec<(u16, KeyTruth)> {
    *steps += 1;
    match expr {
        Expr::True => Vec::new(),
        Expr::Eq { key, class } => vec![(
            *key,
            KeyTruth {
                can_be_true: Classes::Only(vec![*class]),
                can_be_false: Classes::Except(vec![*class]),
            },
        )],
        Expr::Exists { key } => vec![(
            *key,
            KeyTruth {
                can_be_true: Classes::Except(vec![ABSENT]),
                can_be_false: Classes::Only(vec![ABSENT]),
            },
        )],
        Expr::Not(inner) => key_truths(inner, steps)
            .into_iter()
            .map(|(k, t)| {
                (
                    k,
                    KeyTruth {
                        can_be_true: t.can_be_false,
                        can_be_false: t.can_be_true,
                    },
                )
            })
            .collect(),
        Expr::And(children) | Expr::Or(children) => {
            let is_and = matches!(expr, Expr::And(_));
            // Per key: the combined truth, and how many children mention the key.
            let mut acc: BTreeMap<u16, (KeyTruth, usize)> = BTreeMap::new();
            for child in children.iter() {
                for (k, t) in key_truths(child, steps) {
                    *steps += (t.can_be_true.len() + t.can_be_false.len()) as u64;
                    match acc.get_mut(&k) {
                        None => {
                            acc.insert(k, (t, 1));
                        }
                        Some((a, n)) => {
                            *steps += (a.can_be_true.len() + a.can_be_false.len()) as u64;
                            *n += 1;
                            *a = if is_and {
                                KeyTruth {
                                    can_be_true: a.can_be_true.intersection(&t.can_be_true),
                                    can_be_false: a.can_be_false.union(&t.can_be_false),
                                }
                            } else {
                                KeyTruth {
                                    can_be_true: a.can_be_true.union(&t.can_be_true),
                                    can_be_false: a.can_be_false.intersection(&t.can_be_false),
                                }
                            };
                        }
                    }
                }
            }
            // A child that does not mention a key can be true and false under every class.
            acc.into_iter()
                .map(|(k, (mut t, n))| {
                    if n < children.len() {
                        if is_and {
                            t.can_be_false = Classes::ALL;
                        } else {
                            t.can_be_true = Classes::ALL;
                        }
                    }
                    (k, t)
                })
                .filter(|(_, t)| !(t.can_be_true.is_all() && t.can_be_false.is_all()))
                .collect()
        }
    }
}

struct Search<'a> {
    compiled: &'a Compiled,
    live: &'a LiveClasses,
    assignment: Vec<Option<u32>>,
    found: BTreeMap<(usize, usize), ParamSet>,
    /// `words` bits per variant: the partners it may still overlap with, not yet found.
    open: Vec<u64>,
    words: usize,
    budget: &'a mut Budget,
}

impl Search<'_> {
    fn is_open(&self, a: usize, b: usize) -> bool {
        self.open[a * self.words + b / 64] & (1 << (b % 64)) != 0
    }

    fn close(&mut self, a: usize, b: usize) {
        self.open[a * self.words + b / 64] &= !(1 << (b % 64));
        self.open[b * self.words + a / 64] &= !(1 << (a % 64));
    }

    fn visit(&mut self, candidates: &[usize]) -> Result<(), BudgetExceeded> {
        let mut alive = Vec::with_capacity(candidates.len());
        let mut trues = Vec::new();
        let mut unknown = Vec::new();
        self.budget.spend(self.compiled.eval_cost(candidates))?;
        for &v in candidates {
            match self.compiled.eval(v, &self.assignment) {
                Truth::False => {}
                Truth::True => {
                    alive.push(v);
                    trues.push(v);
                }
                Truth::Unknown => {
                    alive.push(v);
                    unknown.push(v);
                }
            }
        }
        if alive.len() < 2 {
            return Ok(());
        }
        if trues.len() >= 2 {
            self.budget.spend((trues.len() * trues.len()) as u64 / 2)?;
            let mut witness = None;
            for (i, &a) in trues.iter().enumerate() {
                for &b in &trues[i + 1..] {
                    if self.is_open(a, b) {
                        let w =
                            witness.get_or_insert_with(|| self.compiled.witness(&self.assignment));
                        self.found.insert((a, b), w.clone());
                        self.close(a, b);
                    }
                }
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        // Keep the variants that still have an open partner among the live ones.
        self.budget.spend((alive.len() * self.words) as u64)?;
        let mut alive_bits = vec![0u64; self.words];
        for &v in &alive {
            alive_bits[v / 64] |= 1 << (v % 64);
        }
        let has_partner = |v: &usize| {
            let row = &self.open[v * self.words..(v + 1) * self.words];
            row.iter().zip(&alive_bits).any(|(o, a)| o & a != 0)
        };
        alive.retain(has_partner);
        unknown.retain(has_partner);
        if alive.len() < 2 {
            return Ok(());
        }
        let Some(key) = self.pick_split_key(&alive, &unknown)? else {
            return Ok(());
        };
        for class in self.compiled.classes_in_search_order(key) {
            self.assignment[key] = Some(class);
            self.visit(&alive)?;
        }
        self.assignment[key] = None;
        Ok(())
    }

    /// Among the unassigned keys some undecided variant mentions, the one with the fewest live
    /// variants summed over its classes (the earliest on a tie).
    fn pick_split_key(
        &mut self,
        alive: &[usize],
        unknown: &[usize],
    ) -> Result<Option<usize>, BudgetExceeded> {
        let mut mask = 0u64;
        for &v in unknown {
            mask |= self.compiled.key_masks[v];
        }
        for (k, class) in self.assignment.iter().enumerate() {
            if class.is_some() {
                mask &= !(1 << k);
            }
        }
        self.budget
            .spend(u64::from(mask.count_ones()) * alive.len() as u64)?;
        let mut best: Option<(u64, usize)> = None;
        while mask != 0 {
            let k = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let score: u64 = alive.iter().map(|&v| self.live.count(v, k)).sum();
            if best.is_none_or(|(s, _)| score < s) {
                best = Some((score, k));
            }
        }
        Ok(best.map(|(_, k)| k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(x: &[u32]) -> Classes {
        Classes::Only(x.to_vec())
    }

    fn except(x: &[u32]) -> Classes {
        Classes::Except(x.to_vec())
    }

    #[test]
    fn class_set_algebra() {
        assert_eq!(only(&[2, 4]).union(&only(&[3, 4])), only(&[2, 3, 4]));
        assert_eq!(only(&[2, 4]).intersection(&only(&[3, 4])), only(&[4]));
        assert_eq!(only(&[2, 4]).union(&except(&[4, 5])), except(&[5]));
        assert_eq!(except(&[4, 5]).intersection(&only(&[2, 4])), only(&[2]));
        assert_eq!(except(&[2, 4]).union(&except(&[4, 5])), except(&[4]));
        assert_eq!(
            except(&[2, 4]).intersection(&except(&[4, 5])),
            except(&[2, 4, 5])
        );
        let mut steps = 0;
        assert!(only(&[2, 4]).disjoint(&only(&[3, 5]), &mut steps));
        assert!(!only(&[2, 4]).disjoint(&only(&[4]), &mut steps));
        assert!(only(&[2, 4]).disjoint(&except(&[2, 3, 4]), &mut steps));
        assert!(!except(&[2, 3]).disjoint(&only(&[2, 4]), &mut steps));
        assert!(!except(&[0]).disjoint(&except(&[2]), &mut steps));
        assert!(only(&[]).disjoint(&except(&[]), &mut steps));
        assert!(steps > 0);
    }
}
