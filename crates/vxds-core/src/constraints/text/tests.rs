//! Unit tests of the constraint text syntax: parsing, printing and error positions.

use super::*;
use crate::params::ParamSet;

fn parse(text: &str) -> Constraints {
    Constraints::parse(text, &Limits::DEFAULT).unwrap()
}

fn err(text: &str) -> ParseError {
    Constraints::parse(text, &Limits::DEFAULT).unwrap_err()
}

fn eq(k: &str, v: &str) -> Constraint {
    Constraint::equals(k, v)
}

#[test]
fn parses_the_examples_from_the_issue() {
    assert_eq!(
        parse(r#"env = "prod" && !exists(version)"#).root(),
        Some(&Constraint::And(vec![
            eq("env", "prod"),
            Constraint::not(Constraint::exists("version"))
        ]))
    );
    assert_eq!(
        parse(r#"env in ("prod", "test")"#).root(),
        Some(&Constraint::Or(vec![eq("env", "prod"), eq("env", "test")]))
    );
    assert_eq!(
        parse(r#"env != "prod""#).root(),
        Some(&Constraint::not(eq("env", "prod")))
    );
    assert!(parse("").is_unconstrained());
    assert!(parse("  *  ").is_unconstrained());
}

#[test]
fn precedence_is_not_then_and_then_or() {
    let c = parse(r#"a = "1" || b = "2" && !c = "3""#);
    assert_eq!(
        c.root(),
        Some(&Constraint::Or(vec![
            eq("a", "1"),
            Constraint::And(vec![eq("b", "2"), Constraint::not(eq("c", "3"))]),
        ]))
    );
    let c = parse(r#"(a = "1" || b = "2") && c == 3"#);
    assert_eq!(
        c.root(),
        Some(&Constraint::And(vec![
            Constraint::Or(vec![eq("a", "1"), eq("b", "2")]),
            eq("c", "3")
        ]))
    );
}

#[test]
fn sugar_and_bare_words() {
    assert_eq!(
        parse("env not in (prod, test)").root(),
        Some(&Constraint::not(Constraint::Or(vec![
            eq("env", "prod"),
            eq("env", "test")
        ])))
    );
    assert_eq!(parse(r#"env in ("prod")"#).root(), Some(&eq("env", "prod")));
    assert_eq!(
        parse("app.kubernetes.io/name = my-app").root(),
        Some(&eq("app.kubernetes.io/name", "my-app"))
    );
    assert_eq!(parse(r#""in" = "x""#).root(), Some(&eq("in", "x")));
    assert_eq!(parse(r#"exists = x"#).root(), Some(&eq("exists", "x")));
    assert_eq!(parse("all()").root(), Some(&Constraint::And(vec![])));
    assert_eq!(
        parse("any(a = b)").root(),
        Some(&Constraint::Or(vec![eq("a", "b")]))
    );
}

#[test]
fn prints_what_it_parses() {
    for text in [
        r#"env = "prod" && !exists(version)"#,
        r#"env in ("prod", "test")"#,
        r#"env != "prod""#,
        r#"env not in ("a", "b")"#,
        r#"(env = "prod" && version = "v1") || zone = "a""#,
        r#"(a = "1" || b = "2") && c = "3""#,
        r#"(a = "1" && b = "2") && c = "3""#,
        r#"!(a = "1" && b = "2")"#,
        r#"!!exists(k)"#,
        r#"all(a = "1")"#,
        "any()",
        r#"* && "odd key" = "quote\"slash\\ é""#,
        r#""in" = "x""#,
    ] {
        assert_eq!(parse(text).to_string(), text);
    }
}

#[test]
fn evaluates_the_parsed_tree() {
    let c = parse(r#"env = "prod" && !exists(version)"#);
    let p = |pairs: &[(&str, &str)]| pairs.iter().copied().collect::<ParamSet>();
    assert!(c.matches(&p(&[("env", "prod")])));
    assert!(!c.matches(&p(&[("env", "prod"), ("version", "v1")])));
}

#[test]
fn errors_give_position_and_expectation() {
    let e = err(r#"env = "prod" &&"#);
    assert_eq!((e.line, e.column), (1, 16));
    assert!(e.expected().unwrap().starts_with("a constraint"), "{e}");
    assert_eq!(
        e.to_string(),
        "line 1, column 16: expected a constraint: `key = \"value\"`, `exists(key)`, `!`, `(` or `*`, found end of input"
    );

    let e = err(r#"env "prod""#);
    assert_eq!(e.column, 5);
    assert_eq!(
        e.expected(),
        Some("`=`, `!=`, `in` or `not in` after the key")
    );

    let e = err("env = \"prod\"\n  & x = y");
    assert_eq!((e.line, e.column), (2, 3));
    assert!(e.to_string().contains("write `&&`"), "{e}");

    let e = err(r#"(env = "prod""#);
    assert_eq!(e.expected(), Some("`)`"));
    let e = err(r#"env = "prod"#);
    assert!(e.to_string().contains("unterminated string"), "{e}");
    let e = err(r#"env = prod) "#);
    assert_eq!(e.expected(), Some("`&&`, `||` or end of input"));
    let e = err(r#""" = "x""#);
    assert!(e.to_string().contains("key must not be empty"));
    let e = err("exists()");
    assert_eq!(e.expected(), Some("a key"));
    let e = err(r#"env in ()"#);
    assert_eq!(e.expected(), Some("a value (a quoted string)"));
}

#[test]
fn hostile_input_hits_limits_not_the_stack() {
    let deep = format!("{}a = b{}", "(".repeat(100_000), ")".repeat(100_000));
    assert!(err(&deep).to_string().contains("nest deeper than 32"));
    let bangs = format!("{}a = b", "!".repeat(100_000));
    assert!(err(&bangs).to_string().contains("nest deeper than 32"));
    let wide = (0..1000)
        .map(|i| format!("k = \"{i}\""))
        .collect::<Vec<_>>()
        .join(" || ");
    assert!(err(&wide).to_string().contains("more than 512 nodes"));
    let long_key = format!("{} = x", "k".repeat(300));
    assert!(err(&long_key).to_string().contains("key is 300 bytes long"));
    assert!(
        err("k = \"a\\u{0}\"")
            .to_string()
            .contains("control character")
    );
}

#[test]
fn unicode_escapes_take_hex_digits_only() {
    // Noticed while writing the `constraint_text` fuzz target: hex digits only, where
    // `from_str_radix` alone would read `+41` as 0x41.
    for escape in ["+41", "-41", "", "1234567", "d800", "x"] {
        let text = format!("k = \"\\u{{{escape}}}\"");
        assert!(
            err(&text).to_string().contains("valid code point"),
            "{text}"
        );
    }
    assert_eq!(parse(r#"k = "\u{41}""#).root(), Some(&eq("k", "A")));
}
