//! The Envoy protobuf edge of vxds.
//!
//! - [`descriptors`]: the descriptor pool of the whole Envoy API, embedded from `envoy-types`, for
//!   proto3 JSON by reflection.
//! - [`constraints`]: lossless conversion between core constraints and
//!   `envoy.service.discovery.v3.DynamicParameterConstraints`, in binary and proto3 JSON form.
//! - [`resource`]: resource types (aliases, message names), bodies in JSON and binary `Any`.
//! - [`rules`]: type-specific rules: gRFC A37 clusters and the aggregate-cluster graph.
//! - [`proto_rules`]: Envoy's protoc-gen-validate rules, inside nested `Any`s too.
//! - [`changeset`]: the write model REST, CLI and fixtures share, and its validation.
//! - [`pointer`]: JSON pointers, so every error names its field.
//! - [`references`]: what a body names in other types (RDS, EDS, SDS, clusters).
//!
//! `envoy-types` pulls in tonic, so this lives outside the pure `vxds-core`.
#![forbid(unsafe_code)]

pub mod changeset;
pub mod collections;
pub mod constraints;
pub mod descriptors;
pub mod pointer;
pub mod proto_rules;
pub mod references;
pub mod resource;
pub mod rules;

/// The Envoy API types, re-exported so dependants use one version.
pub use envoy_types::pb;
