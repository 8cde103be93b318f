//! `xdstp://` names (TP1): parsing, the normal form, globs and subscriptions.
//!
//! The input is one or two names, one a line. Properties: printing a parsed name and parsing
//! it again gives the same value; the normal form is a fixed point of `normalize`; a URN is a
//! member of its own collection, and glob membership agrees with `collection()`; the three
//! entry points (`XdstpUrl`, `XdstpUrn`, `SubscriptionName`) agree on what they accept.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use vxds_core::xdstp::{self, ResourceName, SubscriptionName, XdstpUrl, XdstpUrn};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, second) = text.split_once('\n').unwrap_or((text, ""));
    for name in [first, second] {
        check_url(name);
        check_urn(name);
        check_subscription(name);
    }
    check_membership(first, second);
});

fn check_url(name: &str) {
    let Ok(url) = XdstpUrl::parse(name) else {
        return;
    };
    let printed = url.to_string();
    let again = XdstpUrl::parse(&printed)
        .unwrap_or_else(|e| panic!("{name:?} prints as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, url, "{name:?} -> {printed:?}");
    assert_eq!(again.to_string(), printed, "{name:?}");
    // A URL without glob or directives is a URN, and the URN parser agrees.
    let urn = XdstpUrn::parse(name);
    let plain = !url.is_glob() && url.directives().is_empty();
    assert_eq!(urn.is_ok(), plain, "{name:?}: {urn:?}");
    if let Ok(urn) = urn {
        assert_eq!(url.into_urn().as_ref(), Ok(&urn), "{name:?}");
    }
}

fn check_urn(name: &str) {
    let parsed = ResourceName::parse(name);
    if !xdstp::is_xdstp(name) {
        assert_eq!(parsed, Ok(ResourceName::Opaque(name.to_owned())));
        assert_eq!(xdstp::normalize(name), Ok(Cow::Borrowed(name)));
        return;
    }
    let normal = xdstp::normalize(name);
    let Ok(ResourceName::Xdstp(urn)) = parsed else {
        assert!(
            normal.is_err(),
            "{name:?}: normalize accepts what parse refuses"
        );
        return;
    };
    let normal = normal.unwrap_or_else(|e| panic!("{name:?}: parses but does not normalise: {e}"));
    assert_eq!(normal, urn.to_string(), "{name:?}");
    // The normal form is a fixed point, and names the same resource.
    let renormal = xdstp::normalize(&normal)
        .unwrap_or_else(|e| panic!("{name:?}: normal form {normal:?} is refused: {e}"));
    assert!(
        matches!(renormal, Cow::Borrowed(_)),
        "{name:?}: {normal:?} normalises to {renormal:?}"
    );
    assert_eq!(XdstpUrn::parse(&normal).as_ref(), Ok(&urn), "{name:?}");
    // Built from its decoded parts, it is the same URN.
    let rebuilt = XdstpUrn::new(
        urn.authority(),
        urn.resource_type(),
        urn.id(),
        urn.context().clone(),
    );
    assert_eq!(rebuilt.as_ref(), Ok(&urn), "{name:?}");
    // A member of its own collection, which prints and parses as a glob.
    let collection = urn.collection().expect("every URN has a collection");
    assert!(collection.is_glob(), "{name:?}: {collection}");
    assert!(
        collection.glob_matches(&urn),
        "{name:?} is not in {collection}"
    );
    let printed = collection.to_string();
    assert_eq!(
        XdstpUrl::parse(&printed).as_ref(),
        Ok(&collection),
        "{name:?}: collection {printed:?}"
    );
}

fn check_subscription(name: &str) {
    let subscription = SubscriptionName::parse(name);
    if !xdstp::is_xdstp(name) {
        assert_eq!(subscription, Ok(SubscriptionName::Opaque(name.to_owned())));
        return;
    }
    let url = XdstpUrl::parse(name);
    assert_eq!(
        subscription.is_ok(),
        url.is_ok(),
        "{name:?}: {subscription:?}"
    );
    let (Ok(subscription), Ok(url)) = (subscription, url) else {
        return;
    };
    let bare = url.without_directives();
    match subscription {
        SubscriptionName::Glob(glob) => {
            assert!(glob.directives().is_empty(), "{name:?}");
            assert_eq!(glob, bare, "{name:?}");
        }
        SubscriptionName::Urn(urn) => {
            assert_eq!(bare.into_urn().as_ref(), Ok(&urn), "{name:?}");
            // What the stream machine keys a URN subscription by.
            let key = urn.to_string();
            assert_eq!(
                XdstpUrn::parse(&key).as_ref(),
                Ok(&urn),
                "{name:?}: {key:?}"
            );
        }
        SubscriptionName::Opaque(_) => panic!("{name:?} is xdstp but subscribes as opaque"),
    }
}

/// `glob_matches` is exactly "the URN's collection is this glob".
fn check_membership(glob: &str, member: &str) {
    let (Ok(glob), Ok(urn)) = (XdstpUrl::parse(glob), XdstpUrn::parse(member)) else {
        return;
    };
    let in_collection = urn.collection().as_ref() == Some(&glob.without_directives());
    assert_eq!(
        glob.glob_matches(&urn),
        glob.is_glob() && in_collection,
        "{glob} vs {urn}"
    );
}
