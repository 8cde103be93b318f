//! The coverage grid: for the keys a variant set constrains, every combination of the values
//! the variants mention, any other value and absence, with the variant each combination gets.
//!
//! The picture an operator reads next to the [coverage report](super::coverage): where the
//! report lists uncovered regions, the grid shows the whole space the variants can tell apart,
//! cell by cell. Every value a variant does not mention behaves alike, so the grid is exact:
//! each cell stands for all the parameter sets in its classes.

use serde::Serialize;

use super::compiled::{ABSENT, Compiled, OTHER, Truth};
use crate::constraints::CanonicalConstraints;
use crate::params::ParamSet;

/// Cells a grid may have; larger spaces are refused (the coverage report still answers).
pub const MAX_CELLS: usize = 4096;

/// One key's columns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GridKey {
    pub key: String,
    /// The values some variant compares the key with, sorted, then [`GridValue::Other`] and
    /// [`GridValue::Absent`].
    pub values: Vec<GridValue>,
}

/// One class of a key's values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum GridValue {
    /// A value some variant mentions.
    Value(String),
    /// Any value no variant mentions.
    Other,
    /// The key is not sent.
    Absent,
}

/// One combination: a class per key (in [`CoverageGrid::keys`] order) and its variant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GridCell {
    /// Per key, the index into its [`GridKey::values`].
    pub classes: Vec<usize>,
    /// A parameter set in the cell (absent keys left out; "other" as an invented value).
    pub example: ParamSet,
    /// The index of the matching variant; `None`: the cell is not covered.
    pub variant: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CoverageGrid {
    pub keys: Vec<GridKey>,
    /// Every combination, the last key varying fastest.
    pub cells: Vec<GridCell>,
    /// How many cells no variant covers.
    pub uncovered: usize,
}

/// Why there is no grid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GridError {
    #[error(
        "the variants tell {cells} combinations apart; the grid shows at most {limit}",
        cells = .cells.map_or_else(|| "too many".to_owned(), |c| c.to_string())
    )]
    TooLarge { cells: Option<u128>, limit: usize },
    #[error("the variants constrain more keys than the analysis handles")]
    TooManyKeys,
}

/// The grid of `variants` (in their stored order; a cell's variant is an index into it).
/// When variants overlap (a set the store refuses) a cell gets the first that matches.
pub fn coverage_grid(variants: &[CanonicalConstraints]) -> Result<CoverageGrid, GridError> {
    let refs: Vec<&CanonicalConstraints> = variants.iter().collect();
    let compiled = Compiled::new(&refs).ok_or(GridError::TooManyKeys)?;
    let key_count = compiled.key_count();
    // Per key, its classes in column order: mentioned values, other, absent.
    let classes: Vec<Vec<u32>> = (0..key_count)
        .map(|k| {
            (2..compiled.class_count(k))
                .chain([OTHER, ABSENT])
                .collect()
        })
        .collect();
    let total = classes
        .iter()
        .try_fold(1u128, |n, c| n.checked_mul(c.len() as u128));
    match total {
        Some(n) if n <= MAX_CELLS as u128 => {}
        cells => {
            return Err(GridError::TooLarge {
                cells,
                limit: MAX_CELLS,
            });
        }
    }
    let keys = (0..key_count)
        .map(|k| GridKey {
            key: compiled.keys[k].clone(),
            values: classes[k]
                .iter()
                .map(|&class| match class {
                    OTHER => GridValue::Other,
                    ABSENT => GridValue::Absent,
                    class => GridValue::Value(
                        compiled
                            .value_of_class(k, class)
                            .unwrap_or_default()
                            .to_owned(),
                    ),
                })
                .collect(),
        })
        .collect();
    let mut cells = Vec::new();
    let mut position = vec![0usize; key_count];
    loop {
        let assignment: Vec<Option<u32>> = position
            .iter()
            .enumerate()
            .map(|(k, &i)| Some(classes[k][i]))
            .collect();
        // A full assignment decides every expression: no `Unknown`.
        let variant = (0..variants.len()).find(|&v| compiled.eval(v, &assignment) == Truth::True);
        cells.push(GridCell {
            classes: position.clone(),
            example: compiled.witness(&assignment),
            variant,
        });
        // The next combination, the last key fastest.
        let mut k = key_count;
        loop {
            if k == 0 {
                let uncovered = cells.iter().filter(|c| c.variant.is_none()).count();
                return Ok(CoverageGrid {
                    keys,
                    cells,
                    uncovered,
                });
            }
            k -= 1;
            position[k] += 1;
            if position[k] < classes[k].len() {
                break;
            }
            position[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraints::Constraints;
    use crate::params::Params;
    use crate::variants::VariantMatcher;

    fn set(texts: &[&str]) -> Vec<CanonicalConstraints> {
        texts
            .iter()
            .map(|t| {
                t.parse::<Constraints>()
                    .unwrap_or_else(|e| panic!("{t}: {e}"))
                    .canonical()
            })
            .collect()
    }

    #[test]
    fn two_keys_make_a_table_with_other_and_absent() {
        let variants = set(&[
            r#"env = "prod" && version = "v1""#,
            r#"env = "prod" && version != "v1""#,
            r#"env = "test" && exists(version)"#,
        ]);
        let grid = coverage_grid(&variants).unwrap();
        let keys: Vec<&str> = grid.keys.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, ["env", "version"]);
        assert_eq!(
            grid.keys[0].values,
            [
                GridValue::Value("prod".into()),
                GridValue::Value("test".into()),
                GridValue::Other,
                GridValue::Absent
            ]
        );
        assert_eq!(grid.cells.len(), 4 * 3);
        let at = |env: usize, version: usize| &grid.cells[env * 3 + version];
        assert_eq!(at(0, 0).variant, Some(0)); // prod, v1
        assert_eq!(at(0, 1).variant, Some(1)); // prod, other
        assert_eq!(at(0, 2).variant, Some(1)); // prod, absent: != holds without the key
        assert_eq!(at(1, 0).variant, Some(2)); // test, v1
        assert_eq!(at(1, 2).variant, None); // test, absent
        assert!((0..3).all(|v| at(2, v).variant.is_none() && at(3, v).variant.is_none()));
        assert_eq!(grid.uncovered, 1 + 3 + 3);
        // Every cell's example resolves, with the matcher the streams use, to the cell's variant.
        let matcher = VariantMatcher::new(&variants);
        for cell in &grid.cells {
            assert_eq!(matcher.resolve(&cell.example), cell.variant, "{cell:?}");
        }
        assert_eq!(Params::get(&at(2, 1).example, "env"), Some("other"));
        assert_eq!(Params::get(&at(3, 1).example, "env"), None);
    }

    #[test]
    fn an_unconstrained_variant_is_one_covered_cell() {
        let grid = coverage_grid(&set(&["*"])).unwrap();
        assert!(grid.keys.is_empty());
        assert_eq!(grid.cells.len(), 1);
        assert_eq!(grid.cells[0].variant, Some(0));
        assert_eq!(grid.uncovered, 0);
    }

    #[test]
    fn too_many_combinations_are_refused_with_the_count() {
        let texts: Vec<String> = (0..7)
            .map(|k| format!(r#"k{k} = "a" || k{k} = "b""#))
            .collect();
        let text = texts.join(" && ");
        let err = coverage_grid(&set(&[&text])).unwrap_err();
        assert_eq!(
            err,
            GridError::TooLarge {
                cells: Some(4u128.pow(7)),
                limit: MAX_CELLS
            }
        );
        assert!(err.to_string().contains("16384 combinations"), "{err}");
    }
}
