//! The chargeback report: usage rows (`GET /v1/usage`) rolled up the tenant tree, or grouped by
//! team, pool or GPU model, priced with [`Rates`], rendered for people (text, HTML) and programs
//! (CSV, JSON).
//!
//! Every figure is summed in integers (GPU unit-seconds, 7000 per GPU-second; costs in
//! millionths), and a group's figure is the sum of its rows: the lines of one level (the
//! tenants under one parent, the teams, the pools, the models) add up exactly to the fleet's
//! total.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use tessera_compiler::units::Gpus;

use super::rates::{Micros, Rates};
use crate::store::usage::UsageRow;
// The report's HTML escapes as the fleet page does: one rule for text put into markup.
use crate::ui::html::escape;

/// What `GET /v1/usage` answers: the rows of the window, and the tenant tree they roll up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// Unix seconds, `[since, until)`.
    pub since: i64,
    pub until: i64,
    /// Every tenant of the policy in force the caller may see, with its path from the root.
    pub tenants: Vec<TenantPath>,
    pub rows: Vec<UsageRow>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPath {
    pub name: String,
    /// Names from the root down to this tenant.
    pub path: Vec<String>,
}

/// How the report's lines are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Every tenant, its line counting its whole subtree, in tree order.
    Tenant,
    /// Each tenant's usage under its ancestor at this depth of the tenant tree (the root is
    /// depth 0): with the root's children the organisations, depth 2 is their teams, and a
    /// team's line counts its projects. A tenant above that depth is a line of its own,
    /// counting only its own usage (its deeper tenants count under their teams), so every row
    /// counts in exactly one line.
    Team {
        depth: usize,
    },
    Pool,
    Model,
}

/// One line of the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    pub name: String,
    /// Depth in the tenant tree (0 for other groupings).
    pub depth: usize,
    pub gpu_unit_seconds: i64,
    pub guaranteed_unit_seconds: i64,
    pub borrowed_unit_seconds: i64,
    pub unclassified_unit_seconds: i64,
    pub reserved_idle_unit_seconds: i64,
    pub preemption_lost_unit_seconds: i64,
    pub cpu_millicore_seconds: i64,
    pub memory_mib_seconds: i64,
    /// In millionths of the currency; `None` without rates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<Micros>,
}

impl Line {
    fn add(&mut self, row: &UsageRow, cost: Option<Micros>) {
        self.gpu_unit_seconds += row.gpu_unit_seconds;
        self.guaranteed_unit_seconds += row.guaranteed_unit_seconds;
        self.borrowed_unit_seconds += row.borrowed_unit_seconds;
        self.unclassified_unit_seconds += row.unclassified_unit_seconds;
        self.reserved_idle_unit_seconds += row.reserved_idle_unit_seconds;
        self.preemption_lost_unit_seconds += row.preemption_lost_unit_seconds;
        self.cpu_millicore_seconds += row.cpu_millicore_seconds;
        self.memory_mib_seconds += row.memory_mib_seconds;
        if let Some(c) = cost {
            *self.cost_micros.get_or_insert(0) += c;
        }
    }
}

/// The report as lines and the fleet's total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub since: i64,
    pub until: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub currency: String,
    pub lines: Vec<Line>,
    pub total: Line,
    /// GPU models held in the window that the rates file does not price.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<String>,
}

/// Groups and prices `report`'s rows. A row's cost is computed once and added to every line
/// it counts in, so a parent's cost is exactly its children's plus its own.
pub fn summarize(report: &UsageReport, by: By, rates: Option<&Rates>) -> Summary {
    let mut unpriced = Vec::new();
    let costed: Vec<(&UsageRow, Option<Micros>)> = report
        .rows
        .iter()
        .map(|row| {
            let cost = rates.map(|r| match &row.model {
                Some(model) => r
                    .cost(model, row.profile.as_deref(), row.gpu_unit_seconds)
                    .unwrap_or_else(|| {
                        if !unpriced.contains(model) {
                            unpriced.push(model.clone());
                        }
                        0
                    }),
                None => 0,
            });
            (row, cost)
        })
        .collect();
    let mut total = Line {
        name: "total".into(),
        ..Line::default()
    };
    for (row, cost) in &costed {
        total.add(row, *cost);
    }
    let lines = match by {
        By::Tenant => by_tenant(report, &costed),
        By::Team { depth } => by_team(report, &costed, depth),
        By::Pool => grouped(&costed, |r| r.pool.clone()),
        By::Model => grouped(&costed, |r| {
            r.model
                .clone()
                .unwrap_or_else(|| "(reserved idle, preemptions)".into())
        }),
    };
    unpriced.sort();
    Summary {
        since: report.since,
        until: report.until,
        currency: rates.map(|r| r.currency.clone()).unwrap_or_default(),
        lines,
        total,
        unpriced,
    }
}

fn grouped(costed: &[(&UsageRow, Option<Micros>)], key: impl Fn(&UsageRow) -> String) -> Vec<Line> {
    let mut lines: BTreeMap<String, Line> = BTreeMap::new();
    for (row, cost) in costed {
        let name = key(row);
        lines
            .entry(name.clone())
            .or_insert_with(|| Line {
                name,
                ..Line::default()
            })
            .add(row, *cost);
    }
    lines.into_values().collect()
}

/// Each tenant's line counts its subtree; tenants in tree (pre-)order. Usage of a tenant no
/// longer in the policy is a line of its own at the top.
fn by_tenant(report: &UsageReport, costed: &[(&UsageRow, Option<Micros>)]) -> Vec<Line> {
    let paths: BTreeMap<&str, &[String]> = report
        .tenants
        .iter()
        .map(|t| (t.name.as_str(), t.path.as_slice()))
        .collect();
    // Keyed by path, so that the map's order is the tree's pre-order.
    let mut lines: BTreeMap<Vec<String>, Line> = report
        .tenants
        .iter()
        .map(|t| {
            (
                t.path.clone(),
                Line {
                    name: t.name.clone(),
                    depth: t.path.len().saturating_sub(1),
                    ..Line::default()
                },
            )
        })
        .collect();
    for (row, cost) in costed {
        match paths.get(row.tenant.as_str()) {
            Some(path) => {
                for end in 1..=path.len() {
                    if let Some(line) = lines.get_mut(&path[..end]) {
                        line.add(row, *cost);
                    }
                }
            }
            None => lines
                .entry(vec![String::new(), row.tenant.clone()])
                .or_insert_with(|| Line {
                    name: format!("{} (not in the policy in force)", row.tenant),
                    ..Line::default()
                })
                .add(row, *cost),
        }
    }
    lines.into_values().collect()
}

/// Each row counted once, under its tenant's ancestor at `depth` (or the tenant itself, when
/// it is shallower); lines in tree order. The teams of the acme example are the root's
/// grandchildren: `by_team(.., 2)` puts `nlp-pretrain` under `nlp`.
fn by_team(
    report: &UsageReport,
    costed: &[(&UsageRow, Option<Micros>)],
    depth: usize,
) -> Vec<Line> {
    let paths: BTreeMap<&str, &[String]> = report
        .tenants
        .iter()
        .map(|t| (t.name.as_str(), t.path.as_slice()))
        .collect();
    // Keyed by the team's path, so that the map's order is the tree's pre-order.
    let mut lines: BTreeMap<Vec<String>, Line> = BTreeMap::new();
    for (row, cost) in costed {
        let (key, name) = match paths.get(row.tenant.as_str()) {
            Some(path) => {
                let team = &path[..path.len().min(depth + 1)];
                // Above the teams (an organisation's own usage): said so, so that the line is
                // not read as the organisation's whole subtree.
                let name = if path.len() <= depth {
                    format!("{} (its own usage)", row.tenant)
                } else {
                    team.last().cloned().unwrap_or_else(|| row.tenant.clone())
                };
                (team.to_vec(), name)
            }
            None => (
                vec![String::new(), row.tenant.clone()],
                format!("{} (not in the policy in force)", row.tenant),
            ),
        };
        lines
            .entry(key)
            .or_insert_with(|| Line {
                name,
                ..Line::default()
            })
            .add(row, *cost);
    }
    lines.into_values().collect()
}

/// `unit_seconds` as GPU-hours with three decimals (exact integer rounding).
pub fn gpu_hours(unit_seconds: i64) -> String {
    decimal(unit_seconds, Gpus::UNITS_PER_GPU * 3600, 3)
}

/// Millionths as an amount with two decimals.
pub fn money(micros: Micros) -> String {
    decimal(micros, 1_000_000, 2)
}

/// `n / d` with `places` decimals, rounded half away from zero.
fn decimal(n: i64, d: i64, places: u32) -> String {
    let scale = 10_i128.pow(places);
    let scaled = (i128::from(n).abs() * scale + i128::from(d) / 2) / i128::from(d);
    let sign = if n < 0 && scaled != 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:0width$}",
        scaled / scale,
        scaled % scale,
        width = places as usize
    )
}

const COLUMNS: [&str; 7] = [
    "gpu-hours",
    "guaranteed",
    "borrowed",
    "unclassified",
    "reserved-idle",
    "preempted-lost",
    "cost",
];

fn cells(line: &Line) -> Vec<String> {
    vec![
        gpu_hours(line.gpu_unit_seconds),
        gpu_hours(line.guaranteed_unit_seconds),
        gpu_hours(line.borrowed_unit_seconds),
        gpu_hours(line.unclassified_unit_seconds),
        gpu_hours(line.reserved_idle_unit_seconds),
        gpu_hours(line.preemption_lost_unit_seconds),
        line.cost_micros.map(money).unwrap_or_else(|| "-".into()),
    ]
}

/// A table for a terminal, tenants indented under their parents.
pub fn human(summary: &Summary) -> String {
    let mut rows: Vec<Vec<String>> = vec![
        std::iter::once("name".to_string())
            .chain(COLUMNS.iter().map(|c| c.to_string()))
            .collect(),
    ];
    for line in summary.lines.iter().chain(std::iter::once(&summary.total)) {
        let mut row = vec![format!(
            "{}{}",
            "  ".repeat(line.depth),
            printable(&line.name)
        )];
        row.extend(cells(line));
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut text = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c == 0 {
                let _ = write!(text, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(text, "  {cell:>w$}", w = widths[c]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    if !summary.currency.is_empty() {
        let _ = writeln!(out, "cost in {}", printable(&summary.currency));
    }
    for model in &summary.unpriced {
        let _ = writeln!(
            out,
            "warning: no price for GPU model {:?} in the rates file (counted as 0)",
            model
        );
    }
    out
}

/// Control characters from tenant or model names shown as visible escapes, never sent to the
/// terminal.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// CSV (RFC 4180): one row per line, then the total; exact unit-second figures included.
pub fn csv(summary: &Summary) -> String {
    let mut out = String::from(
        "name,depth,gpu_hours,guaranteed_gpu_hours,borrowed_gpu_hours,unclassified_gpu_hours,\
         reserved_idle_gpu_hours,preemption_lost_gpu_hours,gpu_unit_seconds,\
         cpu_millicore_seconds,memory_mib_seconds,cost\r\n",
    );
    for line in summary.lines.iter().chain(std::iter::once(&summary.total)) {
        let c = cells(line);
        let _ = write!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}\r\n",
            csv_field(&line.name),
            line.depth,
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            line.gpu_unit_seconds,
            line.cpu_millicore_seconds,
            line.memory_mib_seconds,
            line.cost_micros.map(money).unwrap_or_default(),
        );
    }
    out
}

fn csv_field(s: &str) -> String {
    // A leading = + - @ would be a formula to a spreadsheet.
    let s = match s.chars().next() {
        Some('=' | '+' | '-' | '@') => format!("'{s}"),
        _ => s.to_owned(),
    };
    if s.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// A standalone HTML page (no script), every name escaped.
pub fn html(summary: &Summary) -> String {
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>tessera usage</title><style>body{font-family:sans-serif}\
         table{border-collapse:collapse}td,th{padding:2px 8px;text-align:right}\
         td:first-child,th:first-child{text-align:left}tr.total{font-weight:bold}</style>\
         </head><body>\n",
    );
    let _ = writeln!(
        out,
        "<h1>GPU usage</h1><p>From {} to {} (UTC){}</p>",
        escape(&crate::snapshot::rfc3339(summary.since)),
        escape(&crate::snapshot::rfc3339(summary.until)),
        if summary.currency.is_empty() {
            String::new()
        } else {
            format!(", cost in {}", escape(&summary.currency))
        }
    );
    out.push_str("<table><tr><th>name</th>");
    for c in COLUMNS {
        let _ = write!(out, "<th>{c}</th>");
    }
    out.push_str("</tr>\n");
    for (line, class) in summary
        .lines
        .iter()
        .map(|l| (l, ""))
        .chain(std::iter::once((&summary.total, " class=\"total\"")))
    {
        let _ = write!(
            out,
            "<tr{class}><td style=\"padding-left:{}em\">{}</td>",
            line.depth,
            escape(&line.name)
        );
        for cell in cells(line) {
            let _ = write!(out, "<td>{}</td>", escape(&cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    for model in &summary.unpriced {
        let _ = writeln!(
            out,
            "<p>No price for GPU model {} in the rates file (counted as 0).</p>",
            escape(model)
        );
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tenant: &str, model: &str, unit_seconds: i64) -> UsageRow {
        UsageRow {
            tenant: tenant.into(),
            pool: "p".into(),
            model: Some(model.into()),
            gpu_unit_seconds: unit_seconds,
            unclassified_unit_seconds: unit_seconds,
            ..UsageRow::default()
        }
    }

    fn tenant(name: &str, path: &[&str]) -> TenantPath {
        TenantPath {
            name: name.into(),
            path: path.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn figures_are_exact_decimals() {
        assert_eq!(gpu_hours(Gpus::UNITS_PER_GPU * 3600), "1.000");
        assert_eq!(gpu_hours(Gpus::UNITS_PER_GPU * 18), "0.005");
        assert_eq!(gpu_hours(0), "0.000");
        assert_eq!(money(1_234_567), "1.23");
        assert_eq!(money(-5_000), "-0.01");
    }

    #[test]
    fn hostile_names_are_escaped_in_html_and_neutralised_in_csv() {
        let hostile = "<script>alert('x')</script>";
        let report = UsageReport {
            since: 0,
            until: 3600,
            tenants: vec![
                tenant(hostile, &[hostile]),
                tenant("=cmd|x", &[hostile, "=cmd|x"]),
            ],
            rows: vec![row("=cmd|x", "<b>", 7000)],
        };
        let summary = summarize(&report, By::Tenant, None);
        let page = html(&summary);
        assert!(!page.contains("<script>"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(&#x27;x&#x27;)"),
            "{page}"
        );
        let by_model = html(&summarize(&report, By::Model, None));
        assert!(!by_model.contains("<b>"), "{by_model}");
        let table = csv(&summary);
        assert!(table.contains("\r\n'=cmd|x,1,"), "{table}");
    }

    #[test]
    fn a_parent_counts_its_subtree_and_unknown_tenants_stand_alone() {
        let report = UsageReport {
            since: 0,
            until: 3600,
            tenants: vec![
                tenant("org", &["org"]),
                tenant("a", &["org", "a"]),
                tenant("b", &["org", "b"]),
            ],
            rows: vec![row("a", "m", 10), row("b", "m", 20), row("gone", "m", 5)],
        };
        let s = summarize(&report, By::Tenant, None);
        let names: Vec<(&str, i64)> = s
            .lines
            .iter()
            .map(|l| (l.name.as_str(), l.gpu_unit_seconds))
            .collect();
        assert_eq!(
            names,
            [
                ("gone (not in the policy in force)", 5),
                ("org", 30),
                ("a", 10),
                ("b", 20)
            ]
        );
        assert_eq!(s.total.gpu_unit_seconds, 35);
    }
}
