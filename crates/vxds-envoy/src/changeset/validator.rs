//! The stateless rules of one changeset, operation by operation: types, names, preconditions,
//! variant sets, bodies and what each type's rules require of them.

use super::*;

pub(super) struct Validator<'a> {
    pub(super) config: &'a ValidationConfig,
    pub(super) errors: Vec<Problem>,
    pub(super) warnings: Vec<Problem>,
}

impl Validator<'_> {
    pub(super) fn error(&mut self, problem: Problem) {
        self.errors.push(problem);
    }

    pub(super) fn resource_type(
        &mut self,
        spelling: &str,
        i: usize,
        at: &Pointer,
    ) -> Option<ResourceType> {
        match ResourceType::resolve(spelling) {
            Ok(ty) => Some(ty),
            Err(e) => {
                self.error(
                    Problem::new(at.push("type"), "unknown_type", e.to_string()).at(i, None),
                );
                None
            }
        }
    }

    pub(super) fn precondition(
        &mut self,
        expected: Option<&ExpectedVersion>,
        must_not_exist: bool,
        i: usize,
        at: &Pointer,
    ) -> Option<Precondition> {
        match Precondition::from_request(expected, must_not_exist, at) {
            Ok(p) => Some(p),
            Err(problem) => {
                self.error((*problem).at(i, None));
                None
            }
        }
    }

    /// The resource name in normal form.
    pub(super) fn name(
        &mut self,
        name: &str,
        ty: &ResourceType,
        i: usize,
        at: &Pointer,
    ) -> Option<String> {
        let at = at.push("name");
        let fail =
            |code: &str, message: String| Problem::new(at.clone(), code, message).at(i, None);
        if name.is_empty() {
            self.error(fail(
                "empty_name",
                "a resource name must not be empty".into(),
            ));
            return None;
        }
        if name.len() > xdstp::MAX_NAME_LEN {
            self.error(fail(
                "name_too_long",
                format!(
                    "the name is {} bytes long; the limit is {}",
                    name.len(),
                    xdstp::MAX_NAME_LEN
                ),
            ));
            return None;
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            self.error(fail(
                "invalid_name",
                format!("the name contains the control character U+{:04X}", c as u32),
            ));
            return None;
        }
        if name == "." || name == ".." {
            self.error(fail(
                "invalid_name",
                format!(
                    "the name `{name}` is a URL dot-segment: HTTP clients remove it from a path, \
                     so the admin API could never address the resource"
                ),
            ));
            return None;
        }
        let options = ty.message_name() == crate::collections::LIST_COLLECTION_OPTIONS;
        match ResourceName::parse(name) {
            Ok(ResourceName::Opaque(_)) if options => {
                self.error(fail(
                    "not_a_list_collection",
                    "collection options are named by a list collection's xdstp:// URN".into(),
                ));
                None
            }
            Ok(ResourceName::Opaque(name)) => Some(name),
            Ok(ResourceName::Xdstp(urn)) if options => {
                let checked = crate::collections::check_options_name(&urn)
                    .map_err(|e| (e.code.to_owned(), e.message))
                    .and_then(|()| {
                        urn.check_authority(&self.config.authorities)
                            .map_err(|e| (e.code().to_owned(), e.to_string()))
                    });
                match checked {
                    Ok(()) => Some(urn.to_string()),
                    Err((code, message)) => {
                        self.error(fail(&code, message));
                        None
                    }
                }
            }
            Ok(ResourceName::Xdstp(urn)) => {
                let checked = urn
                    .check_type(ty.type_url())
                    .and_then(|()| urn.check_authority(&self.config.authorities));
                match checked {
                    Ok(()) => Some(urn.to_string()),
                    Err(e) => {
                        self.error(fail(e.code(), e.to_string()));
                        None
                    }
                }
            }
            Err(e) => {
                self.error(fail(e.code(), e.to_string()));
                None
            }
        }
    }

    pub(super) fn delete(
        &mut self,
        i: usize,
        delete: &DeleteRequest,
        at: &Pointer,
    ) -> Option<ValidatedOperation> {
        let ty = self.resource_type(&delete.resource_type, i, at);
        let name = ty
            .as_ref()
            .and_then(|ty| self.name(&delete.name, ty, i, at));
        let precondition = self.precondition(delete.expected_version.as_ref(), false, i, at);
        Some(ValidatedOperation {
            index: i,
            key: ResourceKey {
                type_url: ty?.type_url().into(),
                name: name?,
            },
            precondition: precondition?,
            action: Action::Delete,
        })
    }

    pub(super) fn put(
        &mut self,
        i: usize,
        put: &PutRequest,
        at: &Pointer,
    ) -> Option<ValidatedOperation> {
        let errors_before = self.errors.len();
        let ty = self.resource_type(&put.resource_type, i, at)?;
        let name = self.name(&put.name, &ty, i, at);
        let precondition =
            self.precondition(put.expected_version.as_ref(), put.must_not_exist, i, at);
        let variants_at = at.push("variants");
        let max = self.config.variant_limits.max_variants;
        if put.variants.is_empty() {
            self.error(
                Problem::new(
                    variants_at,
                    "no_variants",
                    "a resource needs at least one variant; delete it instead",
                )
                .at(i, None),
            );
            return None;
        }
        if put.variants.len() > max {
            self.error(
                Problem::new(
                    variants_at,
                    "too_many_variants",
                    format!(
                        "{} variants exceed the limit of {max} per resource",
                        put.variants.len()
                    ),
                )
                .at(i, None),
            );
            return None;
        }
        if self.redirects_a_glob(put, &ty, i, at) {
            return None;
        }
        if put.shared && ty.message_name() != SECRET {
            self.error(
                Problem::new(
                    at.push("shared"),
                    "shared_not_secret",
                    format!(
                        "only secrets are shared or not; a {} is served to every client its \
                         variants match",
                        ty.message_name()
                    ),
                )
                .at(i, None),
            );
        }
        let mut parsed = Vec::with_capacity(put.variants.len());
        for (j, variant) in put.variants.iter().enumerate() {
            let at = variants_at.push(j);
            let constraints = self.constraints(&variant.constraints, i, j, &at.push("constraints"));
            let body = match &variant.redirect {
                Some(target) => self.redirect(
                    target,
                    !variant.resource.is_null(),
                    &ty,
                    name.as_deref(),
                    i,
                    j,
                    &at,
                ),
                None => self.body(
                    &variant.resource,
                    &ty,
                    name.as_deref(),
                    i,
                    j,
                    &at.push("resource"),
                ),
            };
            let ttl = variant.ttl.as_deref().and_then(|text| {
                ttl::parse(text)
                    .map_err(|message| {
                        let problem = Problem::new(at.push("ttl"), "invalid_ttl", message);
                        self.error(problem.at(i, Some(j)));
                    })
                    .ok()
            });
            parsed.push((constraints, (body, ttl)));
        }
        // The set rules need every variant's constraints.
        let canonical: Option<Vec<CanonicalConstraints>> = parsed
            .iter()
            .map(|(c, _)| c.as_ref().map(Constraints::canonical))
            .collect();
        if let Some(canonical) = &canonical {
            self.variant_set(canonical, i, &variants_at);
            if ty.message_name() == SECRET && !put.shared {
                self.secret_access(canonical, i, &variants_at);
            }
        }
        if self.errors.len() > errors_before {
            return None;
        }
        let name = name?;
        let canonical = canonical?;
        let mut variants = Vec::with_capacity(parsed.len());
        let mut children: Option<BTreeSet<String>> = None;
        let mut redirects: BTreeSet<String> = BTreeSet::new();
        for (constraints, (_, (body, ttl))) in canonical.into_iter().zip(parsed) {
            let (body, aggregate) = body?;
            if body.is_redirect() {
                redirects.extend(
                    crate::collections::redirect_target(&body.any_bytes)
                        .and_then(|t| xdstp::XdstpUrl::parse(&t).ok())
                        .and_then(|u| u.without_directives().into_urn().ok())
                        .map(|u| u.to_string()),
                );
            }
            if ty.message_name() == CLUSTER {
                children
                    .get_or_insert_default()
                    .extend(aggregate.into_iter().flatten());
            }
            let constraints_text = constraints.to_string();
            let mut parts: Vec<&[u8]> = vec![
                ty.type_url().as_bytes(),
                constraints_text.as_bytes(),
                body.canonical_json.as_bytes(),
            ];
            // A TTL is part of what the client is sent, so a new TTL is a new version; a
            // variant without one keeps the version it always had.
            let ttl_ms = ttl.map(|t| t.as_millis().to_string());
            if let Some(ttl_ms) = &ttl_ms {
                parts.push(b"ttl");
                parts.push(ttl_ms.as_bytes());
            }
            let version = content_hash("vxds.variant.v1", &parts);
            variants.push(ValidatedVariant {
                constraints,
                body: body.any_bytes,
                version,
                ttl,
            });
        }
        let mut parts: Vec<&[u8]> = vec![ty.type_url().as_bytes(), name.as_bytes()];
        let ids: Vec<String> = variants
            .iter()
            .map(|v| v.constraints.id().to_string())
            .collect();
        for (id, variant) in ids.iter().zip(&variants) {
            parts.push(id.as_bytes());
            parts.push(variant.version.as_bytes());
        }
        // Sharing changes who is served, so it is a new version; an unshared resource keeps
        // the version it always had.
        if put.shared {
            parts.push(b"shared");
        }
        let version = content_hash("vxds.resource.v1", &parts);
        Some(ValidatedOperation {
            index: i,
            key: ResourceKey {
                type_url: ty.type_url().into(),
                name,
            },
            precondition: precondition?,
            action: Action::Put(Box::new(ValidatedResource {
                variants,
                shared: put.shared,
                version,
                aggregate_children: children,
                redirects,
            })),
        })
    }

    pub(super) fn constraints(
        &mut self,
        json: &Value,
        i: usize,
        j: usize,
        at: &Pointer,
    ) -> Option<Constraints> {
        let limits = &self.config.limits;
        let result = match json {
            Value::Null => Ok(Constraints::unconstrained()),
            Value::String(text) => Constraints::parse(text, limits)
                .map_err(|e| Problem::new(at.clone(), "invalid_constraints", e.to_string())),
            Value::Object(_) => constraints_from_json(json, limits).map_err(|e| {
                // Limit errors carry a pointer inside the constraints message.
                let pointer = match &e {
                    crate::constraints::ConstraintsJsonError::Invalid(inner) => {
                        Pointer::parse(&inner.path)
                            .map_or(at.clone(), |p| at.join(&p.spelled_as_in(json)))
                    }
                    crate::constraints::ConstraintsJsonError::Json(_) => at.clone(),
                };
                let message = match &e {
                    crate::constraints::ConstraintsJsonError::Invalid(inner) => {
                        inner.kind.to_string()
                    }
                    other => other.to_string(),
                };
                Problem::new(pointer, e.code(), message)
            }),
            _ => Err(Problem::new(
                at.clone(),
                "invalid_constraints",
                "constraints are compact text, a DynamicParameterConstraints object, or null",
            )),
        };
        match result {
            Ok(c) => Some(c),
            Err(problem) => {
                self.error(problem.at(i, Some(j)));
                None
            }
        }
    }

    /// The body and, for aggregate clusters, the clusters it points to.
    pub(super) fn body(
        &mut self,
        json: &RawJson,
        ty: &ResourceType,
        name: Option<&str>,
        i: usize,
        j: usize,
        at: &Pointer,
    ) -> Option<(Body, Option<Vec<String>>)> {
        // The rules point with protobuf field names; the request may spell them as proto3
        // JSON names. Read as a tree only when a problem needs it.
        let doc = std::cell::OnceCell::new();
        let within = |pointer: &Pointer| {
            at.join(&pointer.spelled_as_in(doc.get_or_init(|| json.to_value())))
        };
        let body = match Body::from_json(json.get(), ty) {
            Ok(body) => body,
            Err(e) => {
                self.error(Problem::new(within(&e.pointer), e.code, e.message).at(i, Some(j)));
                return None;
            }
        };
        if body.is_redirect() {
            let target = crate::collections::redirect_target(&body.any_bytes);
            let checked = match (&target, name) {
                (None, _) => Err(crate::collections::RuleError {
                    pointer: Pointer::root(),
                    code: "invalid_redirect",
                    message: "the ResourceLocator is not a well-formed xdstp:// locator".into(),
                }),
                (Some(target), Some(name)) => {
                    crate::collections::check_redirect(ty.message_name(), name, target).map(|_| ())
                }
                (Some(_), None) => Ok(()),
            };
            if let Err(e) = checked {
                self.error(Problem::new(within(&e.pointer), e.code, e.message).at(i, Some(j)));
                return None;
            }
            return Some((body, None));
        }
        let mut ok = true;
        for e in crate::collections::check_handed_out_names(body.message()) {
            self.error(Problem::new(within(&e.pointer), e.code, e.message).at(i, Some(j)));
            ok = false;
        }
        // What Envoy's own proto rules refuse would be NACKed by every proxy.
        for e in crate::proto_rules::check(body.message()) {
            if e.grpc_only {
                let message = format!(
                    "{} — inside `api_listener`, read by gRPC clients, which do not apply \
                     this rule; an Envoy given this listener would refuse it",
                    e.message
                );
                self.warnings
                    .push(Problem::new(within(&e.pointer), e.code, message).at(i, Some(j)));
            } else {
                self.error(Problem::new(within(&e.pointer), e.code, e.message).at(i, Some(j)));
                ok = false;
            }
        }
        if let Some(member) = crate::collections::member_type(ty.message_name()) {
            for e in crate::collections::check_stored_collection(body.message(), member) {
                self.error(Problem::new(within(&e.pointer), e.code, e.message).at(i, Some(j)));
                ok = false;
            }
        }
        if let (Some(field), Some(name)) = (ty.name_field(), name) {
            let own = body.name(ty).unwrap_or_default();
            let own_normal = xdstp::normalize(&own)
                .map(|n| n.into_owned())
                .unwrap_or(own.clone());
            if own_normal != name {
                let message = if own.is_empty() {
                    format!(
                        "the body's `{}` is empty; it must be the resource name `{name}`",
                        field.name()
                    )
                } else {
                    format!(
                        "the body's `{}` is `{own}` but the resource is named `{name}`",
                        field.name()
                    )
                };
                self.error(
                    Problem::new(
                        within(&Pointer::root().push(field.name())),
                        "name_mismatch",
                        message,
                    )
                    .at(i, Some(j)),
                );
                ok = false;
            }
        }
        let mut aggregate = None;
        if ty.message_name() == CLUSTER {
            let report = rules::check_cluster(&body);
            for e in report.errors {
                self.error(Problem::new(within(&e.pointer), e.code, e.message).at(i, Some(j)));
                ok = false;
            }
            for w in report.warnings {
                self.warnings
                    .push(Problem::new(within(&w.pointer), w.code, w.message).at(i, Some(j)));
            }
            aggregate = report.aggregate_children;
        }
        ok.then_some((body, aggregate))
    }

    /// A variant given as `redirect: <xdstp URL>`: its body is the `ResourceLocator`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn redirect(
        &mut self,
        target: &str,
        has_body: bool,
        ty: &ResourceType,
        name: Option<&str>,
        i: usize,
        j: usize,
        at: &Pointer,
    ) -> Option<(Body, Option<Vec<String>>)> {
        let at = at.push("redirect");
        if has_body {
            self.error(
                Problem::new(
                    at,
                    "redirect_with_body",
                    "a variant is either a body (`resource`) or a redirect, not both",
                )
                .at(i, Some(j)),
            );
            return None;
        }
        let checked = match name {
            Some(name) => crate::collections::check_redirect(ty.message_name(), name, target),
            None => xdstp::XdstpUrl::parse(target)
                .and_then(|u| u.without_directives().into_urn())
                .map_err(|e| crate::collections::RuleError {
                    pointer: Pointer::root(),
                    code: "invalid_redirect",
                    message: e.to_string(),
                }),
        };
        if let Err(e) = checked {
            self.error(Problem::new(at, e.code, e.message).at(i, Some(j)));
            return None;
        }
        let url = xdstp::XdstpUrl::parse(target).ok()?;
        let body = Body::from_any_bytes(crate::collections::redirect_body(&url), ty).ok()?;
        Some((body, None))
    }

    /// TP1: a glob collection itself cannot be redirected (its members can).
    fn redirects_a_glob(
        &mut self,
        put: &PutRequest,
        ty: &ResourceType,
        i: usize,
        at: &Pointer,
    ) -> bool {
        let glob = xdstp::XdstpUrl::parse(&put.name).is_ok_and(|u| u.is_glob());
        let redirect = put.variants.iter().any(|v| {
            v.redirect.is_some()
                || v.resource
                    .get()
                    .contains(crate::collections::RESOURCE_LOCATOR_TYPE_URL)
        });
        if glob && redirect {
            self.errors
                .retain(|p| !(p.operation == Some(i) && p.code != "redirect_of_glob"));
            self.error(
                Problem::new(
                    at.push("name"),
                    "redirect_of_glob",
                    format!(
                        "`{}` is a glob collection, which TP1 does not let be redirected; \
                         redirect its members (`{}`) one by one",
                        put.name,
                        ty.message_name()
                    ),
                )
                .at(i, None),
            );
        }
        glob && redirect
    }

    /// With trusted keys configured, a secret's variants should each hold only for the
    /// identities they name: one that a client of any other identity can match, with the
    /// untrusted parameters it claims, would be served to clients it was not meant for, so the
    /// server serves it to no one unless the secret is marked `shared`. The write is accepted
    /// (the template may change), with this warning.
    pub(super) fn secret_access(
        &mut self,
        variants: &[CanonicalConstraints],
        i: usize,
        at: &Pointer,
    ) {
        let trusted = &self.config.trusted_keys;
        for (j, constraints) in variants.iter().enumerate() {
            let Some(witness) = vxds_core::identity::open_to_any_identity(
                constraints,
                trusted,
                &self.config.variant_limits,
            ) else {
                continue;
            };
            let mut problem = Problem::new(
                at.push(j).push("constraints"),
                "untrusted_secret_variant",
                format!(
                    "variant {j} of this secret matches clients whose certificates vouch for \
                     none of the values it names ({}), so it is served to no client; constrain \
                     it on the trusted keys, or mark the secret `shared: true` to serve it to \
                     any client it matches",
                    trusted.join(", ")
                ),
            )
            .at(i, Some(j));
            problem.witness = Some(witness);
            self.warnings.push(problem);
        }
    }

    pub(super) fn variant_set(
        &mut self,
        variants: &[CanonicalConstraints],
        i: usize,
        at: &Pointer,
    ) {
        let limits = &self.config.variant_limits;
        if let Err(errors) = variants::validate_variant_set(variants, limits) {
            for e in errors {
                let pointer = match e.variant() {
                    Some(j) => at.push(j).push("constraints"),
                    None => at.clone(),
                };
                let witness = e.witness().cloned();
                let mut problem = Problem::new(pointer, e.code(), e.to_string()).at(i, e.variant());
                problem.witness = witness;
                self.error(problem);
            }
        }
        // A variant no client can match is legal, and almost certainly a mistake.
        match variants::never_matching(variants, limits) {
            Ok(dead) => {
                for j in dead {
                    self.warnings.push(
                        Problem::new(
                            at.push(j).push("constraints"),
                            "never_matches",
                            format!(
                                "variant {j}'s constraints `{}` match no parameter set",
                                variants[j]
                            ),
                        )
                        .at(i, Some(j)),
                    );
                }
            }
            Err(VariantSetError::TooComplex { .. } | VariantSetError::TooManyKeys { .. }) => {}
            Err(_) => {}
        }
    }
}
