//! [`check`] and [`Checker`]: a changeset's operations validated one at a time as they are read,
//! duplicates found by key, and the operation limit applied, into a [`Checked`] of what passed
//! and every problem.

use std::collections::HashMap;
use std::hash::BuildHasher;

use super::validator::Validator;
use super::{
    ChangesetRequest, Invalid, OperationRequest, Problem, ResourceKey, Validated,
    ValidatedChangeset, ValidatedOperation, ValidationConfig,
};
use crate::pointer::Pointer;
use crate::resource::ResourceType;

/// Everything the stateless rules found: the operations that passed (so that rules needing
/// stored state can still run on them, and every error be reported at once), every error, and
/// every warning.
#[derive(Clone, Debug)]
pub struct Checked {
    pub changeset: ValidatedChangeset,
    pub errors: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

impl Checked {
    pub fn into_result(self) -> Result<Validated, Invalid> {
        if self.errors.is_empty() {
            Ok(Validated {
                changeset: self.changeset,
                warnings: self.warnings,
            })
        } else {
            Err(Invalid {
                errors: self.errors,
                warnings: self.warnings,
            })
        }
    }
}

/// Runs every stateless rule on `request`, keeping what passed. Each operation's request is
/// dropped once it is validated, so the request and its validated form are not both held whole.
pub fn check(request: ChangesetRequest, config: &ValidationConfig) -> Checked {
    let mut checker = Checker::new(config);
    for op in request.operations {
        checker.push(op);
    }
    checker.finish(ChangesetHeader {
        expected_revision: request.expected_revision,
        dry_run: request.dry_run,
        message: request.message,
    })
}

/// A changeset's fields other than its operations.
#[derive(Clone, Debug, Default)]
pub struct ChangesetHeader {
    pub expected_revision: Option<u64>,
    pub dry_run: bool,
    pub message: Option<String>,
}

/// [`check`] one operation at a time, as they are read: a request body is validated while it is
/// decoded, so that only the validated form of a large changeset (its bodies encoded once) is
/// ever held whole, never the request.
pub struct Checker<'a> {
    validator: Validator<'a>,
    operations: Vec<ValidatedOperation>,
    /// Every operation with a valid key so far, by its key's hash: duplicates are found by key
    /// alone, so that one is reported even when the other operation has problems of its own.
    /// It holds operation indices, not keys (a changeset of 100,000 operations would hold a
    /// second copy of every key): a kept operation's key is in `operations`, a refused one's
    /// in `refused_keys`.
    first_for_key: hashbrown::HashTable<(u64, usize)>,
    refused_keys: HashMap<usize, ResourceKey>,
    hasher: std::hash::RandomState,
    /// Operations pushed, counted past the limit too.
    count: usize,
}

impl std::fmt::Debug for Checker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("operations", &self.operations.len())
            .field("errors", &self.validator.errors.len())
            .field("count", &self.count)
            .finish()
    }
}

impl<'a> Checker<'a> {
    pub fn new(config: &'a ValidationConfig) -> Self {
        Self::with_capacity(config, 0)
    }

    /// A checker for about `operations` operations, known beforehand (a restore's plan): its
    /// lists are sized once instead of grown by doubling (up to the operation limit).
    pub fn with_capacity(config: &'a ValidationConfig, operations: usize) -> Self {
        let operations = operations.min(config.max_operations);
        Self {
            validator: Validator {
                config,
                errors: Vec::new(),
                warnings: Vec::new(),
            },
            operations: Vec::with_capacity(operations),
            first_for_key: hashbrown::HashTable::with_capacity(operations),
            refused_keys: HashMap::new(),
            hasher: std::hash::RandomState::new(),
            count: 0,
        }
    }

    /// The key of operation `i`, pushed before and holding a valid key.
    fn key_at<'s>(
        operations: &'s [ValidatedOperation],
        refused_keys: &'s HashMap<usize, ResourceKey>,
        i: usize,
    ) -> Option<&'s ResourceKey> {
        match operations.binary_search_by_key(&i, |op| op.index) {
            Ok(at) => Some(&operations[at].key),
            Err(_) => refused_keys.get(&i),
        }
    }

    /// Validates the next operation and keeps what passed. Past the operation limit, only
    /// counts.
    pub fn push(&mut self, op: OperationRequest) {
        let i = self.count;
        self.count += 1;
        let config = self.validator.config;
        if self.count > config.max_operations {
            // Nothing of a refused changeset is needed any more.
            if self.count == config.max_operations + 1 {
                self.operations = Vec::new();
                self.first_for_key = hashbrown::HashTable::new();
                self.refused_keys = HashMap::new();
            }
            return;
        }
        let at = Pointer::root().push("operations").push(i);
        let key = key_of(&op, config);
        let hash = key.as_ref().map(|key| self.hasher.hash_one(key));
        if let (Some(key), Some(hash)) = (&key, hash) {
            let (operations, refused_keys) = (&self.operations, &self.refused_keys);
            let found = self.first_for_key.find(hash, |&(h, j)| {
                h == hash && Self::key_at(operations, refused_keys, j) == Some(key)
            });
            if let Some(&(_, first)) = found {
                self.validator.errors.push(
                    Problem::new(
                        at,
                        "duplicate_operation",
                        format!(
                            "operation {i} repeats the resource of operation {first}; one \
                             operation per resource"
                        ),
                    )
                    .at(i, None),
                );
                return;
            }
        }
        let validated = match &op {
            OperationRequest::Put(put) => self.validator.put(i, put, &at),
            OperationRequest::Delete(delete) => self.validator.delete(i, delete, &at),
        };
        if let (Some(key), Some(hash)) = (key, hash) {
            match &validated {
                // The operation's key is the same rule's answer for the same type and name.
                Some(kept) => debug_assert_eq!(kept.key, key),
                None => {
                    self.refused_keys.insert(i, key);
                }
            }
            self.first_for_key
                .insert_unique(hash, (hash, i), |&(h, _)| h);
        }
        self.operations.extend(validated);
    }

    /// Operations pushed so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Problems (errors and warnings) found so far: a caller that wants to name the resource of
    /// each refused operation can tell which pushes found some.
    pub fn problems(&self) -> usize {
        self.validator.errors.len() + self.validator.warnings.len()
    }

    /// Everything found, with the changeset's other fields.
    pub fn finish(self, header: ChangesetHeader) -> Checked {
        let Checker {
            validator: mut v,
            mut operations,
            count,
            ..
        } = self;
        let max = v.config.max_operations;
        if count > max {
            // The same answer however far validation got: only the limit.
            operations = Vec::new();
            v.errors = vec![Problem::new(
                Pointer::root().push("operations"),
                "too_many_operations",
                format!("{count} operations exceed the limit of {max} per changeset"),
            )];
            v.warnings = Vec::new();
        }
        operations.shrink_to_fit();
        Checked {
            changeset: ValidatedChangeset {
                expected_revision: header.expected_revision,
                dry_run: header.dry_run,
                message: header.message,
                operations,
            },
            errors: v.errors,
            warnings: v.warnings,
        }
    }
}

/// The key an operation addresses, if its type and name are valid.
fn key_of(op: &OperationRequest, config: &ValidationConfig) -> Option<ResourceKey> {
    let (spelling, name) = match op {
        OperationRequest::Put(p) => (&p.resource_type, &p.name),
        OperationRequest::Delete(d) => (&d.resource_type, &d.name),
    };
    let ty = ResourceType::resolve(spelling).ok()?;
    let mut scratch = Validator {
        config,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let name = scratch.name(name, &ty, 0, &Pointer::root())?;
    Some(ResourceKey {
        type_url: ty.type_url().into(),
        name,
    })
}
