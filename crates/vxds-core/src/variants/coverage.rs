//! The coverage report: which parameter sets, within declared value domains, match no variant.
//!
//! Information for operators, not a rule (TP2: a client that matches no variant sees the
//! resource as absent). The same class search as the exclusivity check finds the uncovered
//! *regions*: partial assignments under which every variant is false, so one region can stand
//! for many parameter sets and the report stays small.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::compiled::{ABSENT, Budget, BudgetExceeded, Compiled, OTHER, Truth};
use crate::params::ParamSet;

/// The values a key takes in a fleet, e.g. `env` in {prod, canary, test}.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyDomain {
    pub values: BTreeSet<String>,
    /// Whether some clients do not send the key at all.
    #[serde(default)]
    pub allow_absent: bool,
}

impl KeyDomain {
    pub fn of<I: IntoIterator<Item = S>, S: Into<String>>(values: I) -> Self {
        Self {
            values: values.into_iter().map(Into::into).collect(),
            allow_absent: false,
        }
    }

    pub fn or_absent(mut self) -> Self {
        self.allow_absent = true;
        self
    }
}

/// Domains per key. Keys the variants constrain but the domains leave out range over every
/// value and absence; declared keys the variants never mention do not matter.
pub type Domains = BTreeMap<String, KeyDomain>;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CoverageReport {
    /// The keys the variants constrain.
    pub keys: Vec<String>,
    /// Regions no variant matches. A key a region leaves out may take any value of its domain.
    pub uncovered: Vec<UncoveredRegion>,
    /// How many parameter sets the regions hold, when every constrained key has a domain.
    pub uncovered_count: Option<u128>,
    /// How many parameter sets the domains hold, when every constrained key has a domain.
    pub total_count: Option<u128>,
    /// More regions exist than were listed.
    pub truncated: bool,
}

impl CoverageReport {
    pub fn is_complete(&self) -> bool {
        self.uncovered.is_empty()
    }
}

/// Conditions on some keys; a parameter set in the region satisfies all of them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UncoveredRegion {
    pub conditions: BTreeMap<String, KeyCondition>,
    /// One concrete parameter set in the region.
    pub example: ParamSet,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "values")]
pub enum KeyCondition {
    Absent,
    Equals(String),
    /// One of these declared values (none of which any variant mentions).
    OneOf(Vec<String>),
    /// Any value except these (the values the variants mention).
    NotIn(Vec<String>),
}

/// In the compact constraint syntax, e.g. `env = "canary" && !exists(version)`.
impl fmt::Display for UncoveredRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::constraints::Constraint as C;
        let eq = |k: &str, v: &str| C::equals(k, v);
        let parts: Vec<C> = self
            .conditions
            .iter()
            .map(|(k, cond)| match cond {
                KeyCondition::Absent => C::not(C::exists(k.as_str())),
                KeyCondition::Equals(v) => eq(k, v),
                KeyCondition::OneOf(vs) if vs.len() == 1 => eq(k, &vs[0]),
                KeyCondition::OneOf(vs) => C::Or(vs.iter().map(|v| eq(k, v)).collect()),
                KeyCondition::NotIn(vs) => {
                    let not_in = match vs.len() {
                        1 => C::not(eq(k, &vs[0])),
                        _ => C::not(C::Or(vs.iter().map(|v| eq(k, v)).collect())),
                    };
                    C::And(vec![C::exists(k.as_str()), not_in])
                }
            })
            .collect();
        match parts.len() {
            0 => f.write_str("*"),
            1 => fmt::Display::fmt(&parts[0], f),
            _ => fmt::Display::fmt(&C::And(parts), f),
        }
    }
}

/// At most this many regions are listed.
pub(crate) const MAX_REGIONS: usize = 1000;

/// One class of a key as the domain sees it; empty classes are never explored.
#[derive(Clone, Debug)]
struct DomainClass {
    class: u32,
    condition: KeyCondition,
    /// Parameter sets in the class, `None` when unbounded.
    size: Option<u128>,
}

pub(crate) fn report(
    compiled: &Compiled,
    domains: &Domains,
    budget: &mut Budget,
) -> Result<CoverageReport, BudgetExceeded> {
    let classes: Vec<Vec<DomainClass>> = (0..compiled.key_count())
        .map(|k| domain_classes(compiled, k, domains))
        .collect();
    let domain_sizes: Vec<Option<u128>> = classes
        .iter()
        .map(|cs| cs.iter().try_fold(0u128, |acc, c| c.size.map(|s| acc + s)))
        .collect();
    let mut search = CoverageSearch {
        compiled,
        classes: &classes,
        assignment: vec![None; compiled.key_count()],
        budget,
        regions: Vec::new(),
        truncated: false,
    };
    let all: Vec<usize> = (0..compiled.exprs.len()).collect();
    search.visit(&all)?;
    let regions = search.regions;
    let truncated = search.truncated;

    let total_count = product(domain_sizes.iter().copied());
    let uncovered_count = if truncated {
        None
    } else {
        regions.iter().try_fold(0u128, |acc, (assignment, _)| {
            let sizes = assignment.iter().enumerate().map(|(k, class)| match class {
                Some(i) => classes[k][*i].size,
                None => domain_sizes[k],
            });
            product(sizes).map(|n| acc.saturating_add(n))
        })
    };
    Ok(CoverageReport {
        keys: compiled.keys.clone(),
        uncovered: regions.into_iter().map(|(_, region)| region).collect(),
        uncovered_count,
        total_count,
        truncated,
    })
}

fn product(mut sizes: impl Iterator<Item = Option<u128>>) -> Option<u128> {
    sizes.try_fold(1u128, |acc, s| s.map(|s| acc.saturating_mul(s)))
}

fn domain_classes(compiled: &Compiled, key: usize, domains: &Domains) -> Vec<DomainClass> {
    let mentioned = &compiled.values[key];
    let mut out = Vec::new();
    match domains.get(&compiled.keys[key]) {
        Some(domain) => {
            for class in compiled.classes_in_search_order(key) {
                match class {
                    ABSENT if domain.allow_absent => out.push(DomainClass {
                        class,
                        condition: KeyCondition::Absent,
                        size: Some(1),
                    }),
                    ABSENT => {}
                    OTHER => {
                        let unmentioned: Vec<String> = domain
                            .values
                            .iter()
                            .filter(|v| mentioned.binary_search(v).is_err())
                            .cloned()
                            .collect();
                        if !unmentioned.is_empty() {
                            out.push(DomainClass {
                                class,
                                size: Some(unmentioned.len() as u128),
                                condition: KeyCondition::OneOf(unmentioned),
                            });
                        }
                    }
                    class => {
                        let value = compiled.value_of_class(key, class).unwrap_or_default();
                        if domain.values.contains(value) {
                            out.push(DomainClass {
                                class,
                                condition: KeyCondition::Equals(value.to_owned()),
                                size: Some(1),
                            });
                        }
                    }
                }
            }
        }
        None => {
            for class in compiled.classes_in_search_order(key) {
                let (condition, size) = match class {
                    ABSENT => (KeyCondition::Absent, Some(1)),
                    OTHER => (KeyCondition::NotIn(mentioned.clone()), None),
                    class => {
                        let value = compiled.value_of_class(key, class).unwrap_or_default();
                        (KeyCondition::Equals(value.to_owned()), Some(1))
                    }
                };
                out.push(DomainClass {
                    class,
                    condition,
                    size,
                });
            }
        }
    }
    out
}

struct CoverageSearch<'a> {
    compiled: &'a Compiled,
    classes: &'a [Vec<DomainClass>],
    /// Per key, the index into `classes[key]` chosen on this branch.
    assignment: Vec<Option<usize>>,
    budget: &'a mut Budget,
    regions: Vec<(Vec<Option<usize>>, UncoveredRegion)>,
    truncated: bool,
}

impl CoverageSearch<'_> {
    fn class_assignment(&self) -> Vec<Option<u32>> {
        self.assignment
            .iter()
            .enumerate()
            .map(|(k, i)| i.map(|i| self.classes[k][i].class))
            .collect()
    }

    fn visit(&mut self, candidates: &[usize]) -> Result<(), BudgetExceeded> {
        if self.truncated {
            return Ok(());
        }
        self.budget.spend(self.compiled.eval_cost(candidates) + 1)?;
        let classes = self.class_assignment();
        let mut alive = Vec::with_capacity(candidates.len());
        for &v in candidates {
            match self.compiled.eval(v, &classes) {
                Truth::True => return Ok(()),
                Truth::False => {}
                Truth::Unknown => alive.push(v),
            }
        }
        if alive.is_empty() {
            self.record();
            return Ok(());
        }
        let Some(key) = self
            .compiled
            .pick_split_key(alive.iter().copied(), &classes)
        else {
            return Ok(());
        };
        for i in 0..self.classes[key].len() {
            self.assignment[key] = Some(i);
            self.visit(&alive)?;
        }
        self.assignment[key] = None;
        Ok(())
    }

    fn record(&mut self) {
        // A key whose domain is empty admits no parameter set at all, so neither does the region.
        let empty = self
            .assignment
            .iter()
            .zip(self.classes)
            .any(|(a, cs)| a.is_none() && cs.is_empty());
        if empty {
            return;
        }
        if self.regions.len() == MAX_REGIONS {
            self.truncated = true;
            return;
        }
        let mut conditions = BTreeMap::new();
        let mut example = ParamSet::new();
        for (k, chosen) in self.assignment.iter().enumerate() {
            let key = &self.compiled.keys[k];
            match chosen {
                Some(i) => {
                    let class = &self.classes[k][*i];
                    conditions.insert(key.clone(), class.condition.clone());
                    if let Some(value) = example_value(self.compiled, k, &class.condition) {
                        example.insert(key.clone(), value);
                    }
                }
                // Unconstrained on this branch: any value of the domain will do.
                None => {
                    if let Some(value) = self.classes[k]
                        .first()
                        .and_then(|c| example_value(self.compiled, k, &c.condition))
                    {
                        example.insert(key.clone(), value);
                    }
                }
            }
        }
        self.regions.push((
            self.assignment.clone(),
            UncoveredRegion {
                conditions,
                example,
            },
        ));
    }
}

fn example_value(compiled: &Compiled, key: usize, condition: &KeyCondition) -> Option<String> {
    match condition {
        KeyCondition::Absent => None,
        KeyCondition::Equals(v) => Some(v.clone()),
        KeyCondition::OneOf(vs) => vs.first().cloned(),
        KeyCondition::NotIn(_) => compiled.representative(key, OTHER),
    }
}
