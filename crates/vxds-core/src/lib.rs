//! The pure domain of vxds, tested without I/O.
//!
//! - [`constraints`]: TP2 dynamic parameter constraints: the model, its limits, evaluation, the
//!   compact text syntax and the canonical form that identifies a variant.
//! - [`variants`]: the rules a variant set must obey (same key set, mutual exclusivity with a
//!   witness), the coverage report, and the matcher that picks a subscriber's variant.
//! - [`xdstp`]: TP1 `xdstp://` resource names: parsing, normal form, type checks and globs.
//! - [`params`]: dynamic parameter sets as clients send them.
//! - [`identity`]: identity templates that turn a certificate identity into trusted parameters.
//! - [`impact`]: impact preview: the client summary replicas publish, and which clients a
//!   change to a variant set would move.
//! - [`rollout`]: a revision's rollout status: each replica's counts and the fleet's merge.
//!
//! Nothing here touches tokio, sqlx, axum or tonic; the protobuf edge lives in `vxds-envoy`.
#![forbid(unsafe_code)]

pub mod constraints;
pub mod identity;
pub mod impact;
pub mod params;
pub mod rollout;
pub mod variants;
pub mod xdstp;

pub use constraints::{CanonicalConstraints, Constraint, Constraints, ConstraintsId, Limits};
pub use identity::{IdentityMismatch, IdentityTemplate, TemplateError, overlay_trusted};
pub use params::{ParamSet, Params};
