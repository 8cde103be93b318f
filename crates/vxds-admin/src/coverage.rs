//! `GET /v1/resources/{type}/{name}/coverage`: for the keys a resource's variants constrain,
//! every combination of the values they mention (plus any other value and absence) and the
//! variant each gets — the console's coverage picture. Computed by `vxds_core::coverage_grid`
//! from the stored variant set, off the runtime.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use vxds_core::variants::{GridError, GridValue, coverage_grid};

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody, ProblemItem, ReadProblems};
use crate::resources::{ResourcePath, ResourcePathDoc};

#[derive(Debug, Serialize, ToSchema)]
pub struct CoverageRepr {
    pub type_url: String,
    pub name: String,
    /// The resource version the grid was computed from.
    pub version: String,
    /// The variants, in stored order; a cell's `variant` indexes this list.
    pub variants: Vec<GridVariant>,
    /// The constrained keys, in order; a cell's `classes` index each key's `values`.
    pub keys: Vec<GridKeyRepr>,
    /// Every combination, the last key varying fastest.
    pub cells: Vec<GridCellRepr>,
    /// Cells no variant covers: clients there see the resource as absent.
    pub uncovered: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GridVariant {
    pub id: String,
    pub constraints_text: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GridKeyRepr {
    pub key: String,
    /// The values some variant compares the key with, then `other` and `absent`.
    pub values: Vec<GridValueRepr>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GridValueRepr {
    /// `value`, `other` (any value no variant mentions) or `absent` (the key not sent).
    #[schema(example = "value")]
    pub kind: &'static str,
    /// The value, for `value`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GridCellRepr {
    /// Per key, the index into its `values`.
    pub classes: Vec<usize>,
    /// A parameter set in the cell (what `POST /v1/resolve` would be asked with).
    pub example: std::collections::BTreeMap<String, String>,
    /// The index of the variant the cell gets; null: none (uncovered).
    pub variant: Option<usize>,
}

/// Which variant every combination of the mentioned values gets.
#[utoipa::path(
    get,
    path = "/v1/resources/{type}/{name}/coverage",
    operation_id = "getCoverage",
    tag = "resources",
    params(ResourcePathDoc),
    responses(
        (status = 200, description = "The coverage grid", body = CoverageRepr),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such resource", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "More combinations than a grid shows (`grid_too_large`; `vxds_core` allows 4096)", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn get(
    State(state): State<AdminState>,
    path: ResourcePath,
) -> Result<Json<CoverageRepr>, ApiError> {
    let Some(stored) = state.store.get(&path.key).await? else {
        return Err(ApiError::NotFound(format!(
            "there is no {} named `{}`",
            path.ty.alias().unwrap_or(path.ty.message_name()),
            path.key.name
        )));
    };
    let constraints: Vec<_> = stored
        .variants
        .iter()
        .map(|v| v.constraints.clone())
        .collect();
    // Up to 4096 cells, each evaluating every variant: kept off the runtime's threads.
    let grid = tokio::task::spawn_blocking(move || coverage_grid(&constraints))
        .await
        .map_err(|_| ApiError::Internal)?
        .map_err(|e| {
            let code = match e {
                GridError::TooLarge { .. } => "grid_too_large",
                GridError::TooManyKeys => "too_many_keys",
            };
            ApiError::Invalid {
                detail: e.to_string(),
                errors: vec![ProblemItem::new("", code, e.to_string())],
                warnings: Vec::new(),
            }
        })?;
    Ok(Json(CoverageRepr {
        type_url: stored.key.type_url.to_string(),
        name: stored.key.name.clone(),
        version: stored.version.clone(),
        variants: stored
            .variants
            .iter()
            .map(|v| GridVariant {
                id: v.id.to_string(),
                constraints_text: v.constraints.to_string(),
            })
            .collect(),
        keys: grid
            .keys
            .into_iter()
            .map(|k| GridKeyRepr {
                key: k.key,
                values: k
                    .values
                    .into_iter()
                    .map(|v| match v {
                        GridValue::Value(value) => GridValueRepr {
                            kind: "value",
                            value: Some(value),
                        },
                        GridValue::Other => GridValueRepr {
                            kind: "other",
                            value: None,
                        },
                        GridValue::Absent => GridValueRepr {
                            kind: "absent",
                            value: None,
                        },
                    })
                    .collect(),
            })
            .collect(),
        cells: grid
            .cells
            .into_iter()
            .map(|c| GridCellRepr {
                classes: c.classes,
                example: c
                    .example
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                variant: c.variant,
            })
            .collect(),
        uncovered: grid.uncovered,
    }))
}
