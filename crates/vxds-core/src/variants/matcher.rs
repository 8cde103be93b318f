//! Picking a subscriber's variant: [`VariantMatcher::resolve`].
//!
//! Built once per variant set, shared read-only by every stream. It is a decision tree over the
//! constrained keys: each node looks up one key of the subscriber's parameters, maps the value
//! to its class and follows that branch, so a lookup costs at most one hash probe per
//! constrained key, however many variants there are. Identical subtrees are shared, which keeps
//! the tree close to the size of the variant table. A pathological set whose tree would exceed
//! the node budget falls back to evaluating the variants in order; the answer is the same.

use std::collections::{BTreeSet, HashMap};

use super::compiled::{Budget, Compiled, Truth};
use crate::constraints::CanonicalConstraints;
use crate::params::Params;

/// Decision trees larger than this fall back to a scan.
const MAX_NODES: usize = 1 << 16;
/// Evaluation steps allowed while building the tree.
const BUILD_BUDGET: u64 = 4_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Next {
    /// The variant at this index matches, or (`None`) none does.
    Leaf(Option<u32>),
    Node(u32),
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Node {
    key: u16,
    /// Indexed by the class of the key's value.
    children: Box<[Next]>,
}

/// Resolves parameter sets to variants. When variants overlap (a set the store refuses), the
/// first matching variant in order wins, as a scan would decide.
#[derive(Debug)]
pub struct VariantMatcher {
    keys: Vec<String>,
    strategy: Strategy,
}

#[derive(Debug)]
enum Strategy {
    /// Boxed: the compiled form is a few hundred bytes inline, and every indexed resource
    /// holds a matcher.
    Tree(Box<Tree>),
    /// The tree would be too large (or the keys too many): evaluate in order instead.
    Scan(Vec<CanonicalConstraints>),
    /// One variant that every client matches (most resources): nothing to decide, and
    /// nothing to hold, which a store of 100,000 resources notices.
    Everyone,
}

#[derive(Debug)]
struct Tree {
    compiled: Compiled,
    nodes: Vec<Node>,
    root: Next,
}

impl VariantMatcher {
    /// `variants` in their stored order; [`resolve`](Self::resolve) answers with an index
    /// into it.
    pub fn new(variants: &[CanonicalConstraints]) -> Self {
        if let [only] = variants
            && only.is_unconstrained()
        {
            return Self {
                keys: Vec::new(),
                strategy: Strategy::Everyone,
            };
        }
        let refs: Vec<&CanonicalConstraints> = variants.iter().collect();
        let Some(compiled) = Compiled::new(&refs) else {
            return Self::scanning(variants);
        };
        let mut builder = Builder {
            compiled: &compiled,
            nodes: Vec::new(),
            interned: HashMap::new(),
            assignment: vec![None; compiled.key_count()],
            budget: Budget::new(BUILD_BUDGET),
        };
        let all: Vec<usize> = (0..variants.len()).collect();
        match builder.build(&all) {
            Some(root) => {
                let nodes = builder.nodes;
                let keys = compiled.keys.clone();
                Self {
                    keys,
                    strategy: Strategy::Tree(Box::new(Tree {
                        compiled,
                        nodes,
                        root,
                    })),
                }
            }
            None => Self::scanning(variants),
        }
    }

    fn scanning(variants: &[CanonicalConstraints]) -> Self {
        let keys: BTreeSet<&str> = variants.iter().flat_map(|v| v.keys()).collect();
        Self {
            keys: keys.into_iter().map(str::to_owned).collect(),
            strategy: Strategy::Scan(variants.to_vec()),
        }
    }

    /// The index of the variant a client with `params` receives, if any.
    pub fn resolve<P: Params + ?Sized>(&self, params: &P) -> Option<usize> {
        let (compiled, nodes, root) = match &self.strategy {
            Strategy::Tree(tree) => (&tree.compiled, &tree.nodes, tree.root),
            Strategy::Scan(variants) => return variants.iter().position(|v| v.matches(params)),
            Strategy::Everyone => return Some(0),
        };
        let mut next = root;
        loop {
            match next {
                Next::Leaf(variant) => return variant.map(|v| v as usize),
                Next::Node(n) => {
                    let node = &nodes[n as usize];
                    let key = node.key as usize;
                    let class = compiled.class_of(key, params.get(&compiled.keys[key]));
                    next = node.children[class as usize];
                }
            }
        }
    }

    /// The keys that decide between the variants, sorted. Parameters with the same values for
    /// these keys always resolve alike.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Nodes in the decision tree (0 when resolving by scan).
    pub fn node_count(&self) -> usize {
        match &self.strategy {
            Strategy::Tree(tree) => tree.nodes.len(),
            Strategy::Scan(_) | Strategy::Everyone => 0,
        }
    }

    pub fn is_scanning(&self) -> bool {
        matches!(self.strategy, Strategy::Scan(_))
    }
}

struct Builder<'a> {
    compiled: &'a Compiled,
    nodes: Vec<Node>,
    /// Hash-consing: identical nodes are built once.
    interned: HashMap<(u16, Box<[Next]>), u32>,
    assignment: Vec<Option<u32>>,
    budget: Budget,
}

impl Builder<'_> {
    /// `None` when the tree outgrows its budget.
    fn build(&mut self, candidates: &[usize]) -> Option<Next> {
        self.budget.spend(candidates.len() as u64 + 1).ok()?;
        let mut alive = Vec::with_capacity(candidates.len());
        let mut first_true = None;
        for &v in candidates {
            match self.compiled.eval(v, &self.assignment) {
                Truth::False => {}
                Truth::True => {
                    first_true.get_or_insert(v);
                    alive.push(v);
                    // Variants after a certain match can never be chosen.
                    break;
                }
                Truth::Unknown => alive.push(v),
            }
        }
        let Some(key) = self.compiled.pick_split_key(
            alive.iter().copied().filter(|&v| Some(v) != first_true),
            &self.assignment,
        ) else {
            return Some(Next::Leaf(first_true.map(|v| v as u32)));
        };
        let mut children = Vec::with_capacity(self.compiled.class_count(key) as usize);
        for class in 0..self.compiled.class_count(key) {
            self.assignment[key] = Some(class);
            children.push(self.build(&alive)?);
        }
        self.assignment[key] = None;
        // A split whose branches all agree decides nothing.
        if children.iter().all(|c| *c == children[0]) {
            return Some(children[0]);
        }
        let signature = (key as u16, children.into_boxed_slice());
        if let Some(&n) = self.interned.get(&signature) {
            return Some(Next::Node(n));
        }
        if self.nodes.len() >= MAX_NODES {
            return None;
        }
        let n = self.nodes.len() as u32;
        self.nodes.push(Node {
            key: signature.0,
            children: signature.1.clone(),
        });
        self.interned.insert(signature, n);
        Some(Next::Node(n))
    }
}
