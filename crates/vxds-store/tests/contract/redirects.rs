//! TP1 redirects across the store, on both backends: one hop, no cycles, whatever order the
//! redirects are written in.

use super::*;

on_both_backends!(redirects_are_one_hop_across_the_store);

const L: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

fn name(id: &str) -> String {
    format!("xdstp://a/envoy.config.listener.v3.Listener/{id}")
}

fn redirect(from: &str, to: &str) -> Value {
    json!({"op": "put", "type": "listener", "name": name(from), "variants": [{"redirect": name(to)}]})
}

async fn redirects_are_one_hop_across_the_store(db: TestDb) {
    let store = db.store().await;
    let apply = |ops: Vec<Value>| store.apply(changeset(json!({ "operations": ops })), None);
    apply(vec![redirect("a", "b")]).await.unwrap();
    // The redirect reads back as the ResourceLocator it is sent as.
    let stored = store.get(&key(L, &name("a"))).await.unwrap().unwrap();
    assert_eq!(
        vxds_envoy::collections::redirect_target(&stored.variants[0].body),
        Some(name("b"))
    );

    // b may not redirect on (a → b → c), nothing may redirect to a (c → a → b), and b → a
    // closes a cycle: each refused, naming the resource written.
    for (ops, code) in [
        (vec![redirect("b", "c")], "redirect_chain"),
        (vec![redirect("c", "a")], "redirect_chain"),
        (vec![redirect("b", "a")], "redirect_cycle"),
        // Within one changeset too.
        (
            vec![redirect("x", "y"), redirect("y", "z")],
            "redirect_chain",
        ),
    ] {
        assert_eq!(codes(apply(ops).await.unwrap_err())[0], code);
    }
    assert_eq!(store.head_revision().await.unwrap(), 1);

    // Once a no longer redirects, b may.
    let plain = json!({"op": "delete", "type": "listener", "name": name("a")});
    apply(vec![plain]).await.unwrap();
    apply(vec![redirect("b", "c")]).await.unwrap();
}
