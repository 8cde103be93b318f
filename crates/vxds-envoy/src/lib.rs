//! The Envoy protobuf edge of vxds.
//!
//! - [`descriptors`]: the descriptor pool of the whole Envoy API, embedded from `envoy-types`, for
//!   proto3 JSON by reflection.
//! - [`constraints`]: lossless conversion between core constraints and
//!   `envoy.service.discovery.v3.DynamicParameterConstraints`, in binary and proto3 JSON form.
//!
//! `envoy-types` pulls in tonic, so this lives outside the pure `vxds-core`.
#![forbid(unsafe_code)]

pub mod constraints;
pub mod descriptors;

/// The Envoy API types, re-exported so dependants use one version.
pub use envoy_types::pb;
