//! Variant constraints compiled over per-key value classes: the common ground of the
//! exclusivity check, the coverage report and the matcher.
//!
//! For one key, only the values some variant compares it with matter: every other value behaves
//! alike (class [`OTHER`]) and absence is a case of its own (class [`ABSENT`]). A key compared
//! with n values therefore has n + 2 classes, and as far as a variant set can tell, a parameter
//! set is one class per key. Expressions are evaluated in three-valued (Kleene) logic over a
//! partial assignment of classes, which is sound: `True` means true for every completion.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::constraints::{CanonicalConstraints, Constraint};
use crate::params::ParamSet;

pub(crate) const ABSENT: u32 = 0;
pub(crate) const OTHER: u32 = 1;
const FIRST_VALUE: u32 = 2;

/// At most this many distinct keys per variant set (keys are tracked in a `u64` mask).
pub(crate) const MAX_KEYS: usize = 64;

#[derive(Debug)]
pub(crate) enum Expr {
    True,
    Eq { key: u16, class: u32 },
    Exists { key: u16 },
    Not(Box<Expr>),
    And(Box<[Expr]>),
    Or(Box<[Expr]>),
}

impl Expr {
    /// Number of nodes: the most one evaluation can visit.
    pub fn size(&self) -> u64 {
        match self {
            Expr::True | Expr::Eq { .. } | Expr::Exists { .. } => 1,
            Expr::Not(inner) => 1 + inner.size(),
            Expr::And(children) | Expr::Or(children) => {
                1 + children.iter().map(Expr::size).sum::<u64>()
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Truth {
    False,
    True,
    Unknown,
}

#[derive(Debug)]
pub(crate) struct Compiled {
    /// Every key any variant mentions, sorted.
    pub keys: Vec<String>,
    /// Per key, the values variants compare it with, sorted; value `i` is class `i + 2`.
    pub values: Vec<Vec<String>>,
    class_of_value: Vec<HashMap<String, u32>>,
    pub exprs: Vec<Expr>,
    /// Per variant, the keys its expression mentions.
    pub key_masks: Vec<u64>,
    /// Per variant, the nodes of its expression: what evaluating it costs at most, in budget
    /// steps.
    pub sizes: Vec<u64>,
}

impl Compiled {
    /// `None` when the variants mention more than [`MAX_KEYS`] keys.
    pub fn new(variants: &[&CanonicalConstraints]) -> Option<Self> {
        let mut per_key: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for variant in variants {
            if let Some(root) = variant.root() {
                collect_values(root, &mut per_key);
            }
        }
        if per_key.len() > MAX_KEYS {
            return None;
        }
        let keys: Vec<String> = per_key.keys().map(|k| (*k).to_owned()).collect();
        let values: Vec<Vec<String>> = per_key
            .values()
            .map(|vs| vs.iter().map(|v| (*v).to_owned()).collect())
            .collect();
        let class_of_value = values
            .iter()
            .map(|vs| {
                vs.iter()
                    .enumerate()
                    .map(|(i, v)| (v.clone(), FIRST_VALUE + i as u32))
                    .collect()
            })
            .collect();
        let key_index: HashMap<&str, u16> = per_key
            .keys()
            .enumerate()
            .map(|(i, k)| (*k, i as u16))
            .collect();
        let mut compiled = Compiled {
            keys,
            values,
            class_of_value,
            exprs: Vec::new(),
            key_masks: Vec::new(),
            sizes: Vec::new(),
        };
        for variant in variants {
            let (expr, mask) = match variant.root() {
                None => (Expr::True, 0),
                Some(root) => {
                    let mut mask = 0u64;
                    (compiled.compile(root, &key_index, &mut mask), mask)
                }
            };
            compiled.sizes.push(expr.size());
            compiled.exprs.push(expr);
            compiled.key_masks.push(mask);
        }
        Some(compiled)
    }

    fn compile(&self, c: &Constraint, key_index: &HashMap<&str, u16>, mask: &mut u64) -> Expr {
        let mut key_of = |key: &str| {
            let k = key_index[key];
            *mask |= 1 << k;
            k
        };
        match c {
            Constraint::Equals { key, value } => {
                let k = key_of(key);
                Expr::Eq {
                    key: k,
                    class: self.class_of_value[k as usize][value],
                }
            }
            Constraint::Exists { key } => Expr::Exists { key: key_of(key) },
            Constraint::Any => Expr::True,
            Constraint::Not(inner) => Expr::Not(Box::new(self.compile(inner, key_index, mask))),
            Constraint::And(children) => Expr::And(
                children
                    .iter()
                    .map(|c| self.compile(c, key_index, mask))
                    .collect(),
            ),
            Constraint::Or(children) => Expr::Or(
                children
                    .iter()
                    .map(|c| self.compile(c, key_index, mask))
                    .collect(),
            ),
        }
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    pub fn class_count(&self, key: usize) -> u32 {
        FIRST_VALUE + self.values[key].len() as u32
    }

    /// The class of a parameter value (`None` = absent) for `key`.
    pub fn class_of(&self, key: usize, value: Option<&str>) -> u32 {
        match value {
            None => ABSENT,
            Some(v) => self.class_of_value[key].get(v).copied().unwrap_or(OTHER),
        }
    }

    /// Classes in the order searches try them: compared values first (they make readable
    /// witnesses), then any other value, then absence.
    pub fn classes_in_search_order(&self, key: usize) -> impl Iterator<Item = u32> + use<> {
        (FIRST_VALUE..self.class_count(key)).chain([OTHER, ABSENT])
    }

    pub fn value_of_class(&self, key: usize, class: u32) -> Option<&str> {
        class
            .checked_sub(FIRST_VALUE)
            .map(|i| self.values[key][i as usize].as_str())
    }

    /// A concrete value in `class` for `key`, or `None` for absence. For [`OTHER`] it invents
    /// a value that no variant compares the key with.
    pub fn representative(&self, key: usize, class: u32) -> Option<String> {
        match class {
            ABSENT => None,
            OTHER => {
                let taken = &self.class_of_value[key];
                std::iter::once("other".to_owned())
                    .chain((2..).map(|n| format!("other-{n}")))
                    .find(|v| !taken.contains_key(v))
            }
            class => self.value_of_class(key, class).map(str::to_owned),
        }
    }

    /// A parameter set in the given partial assignment; unassigned keys are left absent.
    pub fn witness(&self, assignment: &[Option<u32>]) -> ParamSet {
        let mut params = ParamSet::new();
        for (key, class) in assignment.iter().enumerate() {
            if let Some(value) = class.and_then(|c| self.representative(key, c)) {
                params.insert(self.keys[key].clone(), value);
            }
        }
        params
    }

    /// The budget steps evaluating all of `variants` may take: their expression sizes.
    pub fn eval_cost(&self, variants: &[usize]) -> u64 {
        variants.iter().map(|&v| self.sizes[v]).sum()
    }

    pub fn eval(&self, variant: usize, assignment: &[Option<u32>]) -> Truth {
        eval(&self.exprs[variant], assignment)
    }

    /// The unassigned key that most of `variants` still depend on (the best split), if any.
    pub fn pick_split_key(
        &self,
        variants: impl Iterator<Item = usize>,
        assignment: &[Option<u32>],
    ) -> Option<usize> {
        let mut counts = [0u32; MAX_KEYS];
        for v in variants {
            let mut mask = self.key_masks[v];
            while mask != 0 {
                let k = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                if assignment[k].is_none() {
                    counts[k] += 1;
                }
            }
        }
        let (key, count) = counts[..self.key_count()]
            .iter()
            .enumerate()
            .max_by_key(|(k, count)| (**count, std::cmp::Reverse(*k)))?;
        (*count > 0).then_some(key)
    }
}

fn collect_values<'a>(c: &'a Constraint, per_key: &mut BTreeMap<&'a str, BTreeSet<&'a str>>) {
    match c {
        Constraint::Equals { key, value } => {
            per_key.entry(key).or_default().insert(value);
        }
        Constraint::Exists { key } => {
            per_key.entry(key).or_default();
        }
        Constraint::And(children) | Constraint::Or(children) => {
            children.iter().for_each(|c| collect_values(c, per_key))
        }
        Constraint::Not(inner) => collect_values(inner, per_key),
        Constraint::Any => {}
    }
}

fn eval(expr: &Expr, assignment: &[Option<u32>]) -> Truth {
    let known = |b: bool| if b { Truth::True } else { Truth::False };
    match expr {
        Expr::True => Truth::True,
        Expr::Eq { key, class } => {
            assignment[*key as usize].map_or(Truth::Unknown, |c| known(c == *class))
        }
        Expr::Exists { key } => {
            assignment[*key as usize].map_or(Truth::Unknown, |c| known(c != ABSENT))
        }
        Expr::Not(inner) => match eval(inner, assignment) {
            Truth::True => Truth::False,
            Truth::False => Truth::True,
            Truth::Unknown => Truth::Unknown,
        },
        Expr::And(children) => {
            let mut result = Truth::True;
            for child in children.iter() {
                match eval(child, assignment) {
                    Truth::False => return Truth::False,
                    Truth::Unknown => result = Truth::Unknown,
                    Truth::True => {}
                }
            }
            result
        }
        Expr::Or(children) => {
            let mut result = Truth::False;
            for child in children.iter() {
                match eval(child, assignment) {
                    Truth::True => return Truth::True,
                    Truth::Unknown => result = Truth::Unknown,
                    Truth::False => {}
                }
            }
            result
        }
    }
}

/// Counts evaluation steps against a budget, so hostile variant sets cannot burn CPU.
///
/// A step is a unit of work of about constant cost: one expression node evaluated (an
/// evaluation is charged its expression's full size, whether or not it short-circuits), one
/// requirement compared when pruning pairs, one (variant, key) scored when choosing a split.
#[derive(Debug)]
pub(crate) struct Budget {
    left: u64,
    pub limit: u64,
}

#[derive(Debug)]
pub(crate) struct BudgetExceeded;

impl Budget {
    pub fn new(limit: u64) -> Self {
        Self { left: limit, limit }
    }

    pub fn spend(&mut self, steps: u64) -> Result<(), BudgetExceeded> {
        self.left = self.left.checked_sub(steps).ok_or(BudgetExceeded)?;
        Ok(())
    }
}
