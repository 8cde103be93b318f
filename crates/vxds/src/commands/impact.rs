//! The impact report of a dry run as a short table: per changed resource, how many connected
//! clients switch variant, get a new body, lose or gain it, with sample node ids.

use serde_json::Value;

/// The table for `report` (the `impact` of a dry-run answer).
pub fn table(report: &Value) -> String {
    let replicas: Vec<String> = report["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{} {}",
                r["replica_id"].as_str().unwrap_or("?"),
                r["streams"].as_u64().unwrap_or(0)
            )
        })
        .collect();
    let count =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    if report["streams"].as_u64().unwrap_or(0) == 0 {
        return format!(
            "impact: no clients connected ({} counted)\n",
            count(replicas.len(), "replica", "replicas")
        );
    }
    let mut text = format!(
        "impact on {} connected over {}{}\n",
        count(
            report["streams"].as_u64().unwrap_or(0) as usize,
            "stream",
            "streams"
        ),
        count(replicas.len(), "replica", "replicas"),
        if replicas.is_empty() {
            String::new()
        } else {
            format!(" ({})", replicas.join(", "))
        }
    );
    let mut rows: Vec<[String; 6]> = vec![[
        "RESOURCE".into(),
        "MOVE".into(),
        "FROM".into(),
        "TO".into(),
        "STREAMS".into(),
        "SAMPLE NODES".into(),
    ]];
    for resource in report["resources"].as_array().into_iter().flatten() {
        let ty = resource["type"]
            .as_str()
            .or(resource["type_url"].as_str())
            .unwrap_or_default();
        // Nobody subscribes: nothing to say about it.
        if resource["streams"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let name = format!("{ty} {}", resource["name"].as_str().unwrap_or_default());
        let variant = |v: &Value| v.as_str().unwrap_or("-").to_owned();
        for m in resource["moves"].as_array().into_iter().flatten() {
            // Node ids are the clients' own words: no terminal escapes, no screenfuls.
            let samples: Vec<String> = m["sample_nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(printable)
                .collect();
            rows.push([
                name.clone(),
                m["kind"].as_str().unwrap_or_default().to_owned(),
                variant(&m["from"]),
                variant(&m["to"]),
                m["streams"].as_u64().unwrap_or(0).to_string(),
                samples.join(", "),
            ]);
        }
        let unchanged = resource["unchanged"].as_u64().unwrap_or(0);
        let unmatched = resource["unmatched"].as_u64().unwrap_or(0);
        if unchanged > 0 || resource["moves"].as_array().is_none_or(|m| m.is_empty()) {
            rows.push([
                name.clone(),
                "unchanged".into(),
                String::new(),
                String::new(),
                unchanged.to_string(),
                String::new(),
            ]);
        }
        if unmatched > 0 {
            rows.push([
                name,
                "unmatched".into(),
                String::new(),
                String::new(),
                unmatched.to_string(),
                String::new(),
            ]);
        }
    }
    if rows.len() == 1 {
        text.push_str("  no connected client subscribes to what changes\n");
        return text;
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &rows {
        let mut line = String::from(" ");
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            line.push(' ');
            if i == 5 {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}"));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// `text` with control characters shown escaped and cut to 64 characters, for a terminal.
fn printable(text: &str) -> String {
    let mut out: String = text.chars().take(64).flat_map(char::escape_debug).collect();
    if text.chars().count() > 64 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn one_row_per_move_then_the_unchanged() {
        let report = json!({
            "streams": 5,
            "replicas": [{"replica_id": "a", "streams": 3}, {"replica_id": "b", "streams": 2}],
            "resources": [{
                "type": "route", "name": "web", "streams": 5, "unchanged": 1, "unmatched": 0,
                "moves": [
                    {"kind": "switch", "from": "env = \"prod\"", "to": "env = \"test\"", "streams": 3, "sample_nodes": ["n1", "n2"]},
                    {"kind": "lose", "from": "*", "to": null, "streams": 1, "sample_nodes": ["n3"]},
                ],
            }],
        });
        assert_eq!(
            table(
                &json!({"streams": 0, "replicas": [{"replica_id": "a", "streams": 0}], "resources": []})
            ),
            "impact: no clients connected (1 replica counted)\n"
        );
        let nobody = json!({"streams": 2, "replicas": [], "resources": [
            {"type": "route", "name": "web", "streams": 0, "unchanged": 0, "unmatched": 0, "moves": []}
        ]});
        assert_eq!(
            table(&nobody),
            "impact on 2 streams connected over 0 replicas\n  no connected client subscribes to what changes\n"
        );
        assert_eq!(
            table(&report),
            "impact on 5 streams connected over 2 replicas (a 3, b 2)\n\
             \x20 RESOURCE  MOVE      FROM         TO           STREAMS SAMPLE NODES\n\
             \x20 route web switch    env = \"prod\" env = \"test\" 3       n1, n2\n\
             \x20 route web lose      *            -            1       n3\n\
             \x20 route web unchanged                           1\n"
        );
    }
}
