//! Writers and start-ups racing, on both backends: versions and the aggregate graph hold
//! whatever the interleaving, revisions stay gap-free, and migrations run once.

use vxds_core::variants::{VariantLimits, validate_variant_set};

use super::*;

on_both_backends!(
    concurrent_writers_cannot_break_exclusivity,
    concurrent_writers_cannot_make_a_cycle,
    concurrent_revisions_are_gap_free,
    concurrent_start_ups_migrate_once,
);

/// Writers race to add a variant each to one resource, reading, extending and writing with the
/// version they read. Pairs want the same value, so one of each pair must lose; the other
/// must win, whatever the interleaving.
async fn concurrent_writers_cannot_break_exclusivity(db: TestDb) {
    let store = db.store().await;
    store
        .apply(put_routes(&[(r#"env = "base""#, "base")]), None)
        .await
        .unwrap();
    let writers = 12;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mine = format!(r#"env = "e{}""#, w % (writers / 2));
            loop {
                let current = store.get(&key(ROUTE, "r")).await.unwrap().unwrap();
                let ty = ResourceType::resolve(ROUTE).unwrap();
                let mut variants: Vec<Value> = current
                    .variants
                    .iter()
                    .map(|v| {
                        let body = Body::from_any_bytes(v.body.clone(), &ty)
                            .unwrap()
                            .to_json(&ty);
                        json!({"constraints": v.constraints.to_string(), "resource": body})
                    })
                    .collect();
                variants.push(json!({"constraints": mine, "resource": route("r", &mine)}));
                let request = changeset(
                    json!({"operations": [{"op": "put", "type": "route", "name": "r",
                    "expected_version": current.version, "variants": variants}]}),
                );
                match store.apply(request, Some(format!("writer {w}"))).await {
                    Ok(_) => return true,
                    Err(ApplyError::Conflict(_)) => continue,
                    Err(ApplyError::Invalid(invalid)) => {
                        assert!(
                            invalid.errors.iter().all(|e| e.code == "duplicate_variant"),
                            "{invalid:?}"
                        );
                        return false;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    let mut won = 0;
    for task in tasks {
        won += usize::from(task.await.unwrap());
    }
    assert_eq!(won, writers / 2);
    let last = store.get(&key(ROUTE, "r")).await.unwrap().unwrap();
    assert_eq!(last.variants.len(), 1 + writers / 2);
    let canonical: Vec<_> = last
        .variants
        .iter()
        .map(|v| v.constraints.clone())
        .collect();
    assert_eq!(
        validate_variant_set(&canonical, &VariantLimits::DEFAULT),
        Ok(())
    );
    assert_eq!(
        store.head_revision().await.unwrap(),
        1 + (writers / 2) as u64
    );
}

/// Two changesets that are each fine but together close a cycle: exactly one commits.
async fn concurrent_writers_cannot_make_a_cycle(db: TestDb) {
    let store = db.store().await;
    for round in 0..5 {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        let first = changeset(json!({"operations": [put_cluster(aggregate(&a, &[&b]))]}));
        let second = changeset(json!({"operations": [put_cluster(aggregate(&b, &[&a]))]}));
        let (s1, s2) = (store.clone(), store.clone());
        let (r1, r2) = tokio::join!(
            tokio::spawn(async move { s1.apply(first, None).await }),
            tokio::spawn(async move { s2.apply(second, None).await }),
        );
        let results = [r1.unwrap(), r2.unwrap()];
        let committed = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(committed, 1, "{results:?}");
        let refused = results.into_iter().find_map(Result::err).unwrap();
        assert_eq!(codes(refused), ["aggregate_cycle"]);
    }
}

async fn concurrent_revisions_are_gap_free(db: TestDb) {
    let store = db.store().await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("r{i}");
            let request = changeset(
                json!({"operations": [{"op": "put", "type": "route", "name": name,
                "variants": [{"resource": route(&name, "x")}]}]}),
            );
            store.apply(request, None).await.unwrap().revision
        }));
    }
    let mut revisions = Vec::new();
    for task in tasks {
        revisions.push(task.await.unwrap());
    }
    revisions.sort();
    assert_eq!(revisions, (1..=16).collect::<Vec<u64>>());
    let history: Vec<u64> = store
        .revisions(0, 100)
        .await
        .unwrap()
        .iter()
        .map(|r| r.revision)
        .collect();
    assert_eq!(history, (1..=16).collect::<Vec<u64>>());
}

async fn concurrent_start_ups_migrate_once(db: TestDb) {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(async move {
            Store::connect(&url, StoreOptions::default())
                .await
                .map(drop)
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(db.store().await.head_revision().await.unwrap(), 0);
}
