//! The plan as text: one pure function per `--output` format (JSON is [`Plan::to_json`]).
//!
//! Every renderer lists groups in the same order (tenants, pools, SLO classes, tiers,
//! workloads) and, within a group, changes in [`PolicyDiff`](crate::PolicyDiff)'s order (by
//! name), so that the same plan always reads the same.

use std::fmt::Write;

use crate::decision_diff::{Change, DecisionDiff, FairShareChange, Fate, Standing};
use crate::plan::{Plan, Revision, groups, plural};
use crate::policy_diff::{FieldChange, ItemChange};
use crate::workflow_command::{escape_data, escape_property};

/// Values longer than this are shortened in the terminal view (`--output json` has them whole).
const HUMAN_VALUE_CHARS: usize = 120;

/// At most this many annotations per step: GitHub shows no more.
pub const MAX_ANNOTATIONS: usize = 10;

struct Style {
    color: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
}

fn short_commit(c: &Option<String>) -> Option<&str> {
    c.as_deref().map(|c| &c[..c.len().min(12)])
}

fn side(r: &Revision) -> String {
    let mut s = match (&r.rev, short_commit(&r.commit)) {
        (Some(rev), Some(c)) if rev.as_str() != c => format!("{rev} ({c})"),
        (Some(rev), _) => rev.clone(),
        (None, _) => r.path.clone().unwrap_or_else(|| ".".to_owned()),
    };
    if r.rev.is_some()
        && let Some(p) = &r.path
    {
        let _ = write!(s, " at {p}/");
    }
    s
}

/// `valid, 3 files, 10 documents`; the head's counts include the state file.
fn validity(r: &Revision, head: bool) -> String {
    if r.empty {
        "no policy files".to_owned()
    } else if r.valid {
        format!(
            "valid, {}, {}{}",
            plural(r.files, "file"),
            plural(r.documents, "document"),
            if head { " (with the state)" } else { "" }
        )
    } else {
        format!("invalid, {}", plural(r.errors.max(1), "error"))
    }
}

/// A value as people read it: a MIG layout (or a list of them) as its profiles and slices,
/// anything else as the compact JSON the diff holds.
fn readable(v: &str) -> String {
    fn layout(v: &serde_json::Value) -> Option<String> {
        let instances = v.get("instances")?.as_array()?;
        let profiles: Option<Vec<&str>> = instances
            .iter()
            .map(|i| i.get("profile").and_then(serde_json::Value::as_str))
            .collect();
        let mut s = String::new();
        if let Some(n) = v.get("name").and_then(serde_json::Value::as_str) {
            let _ = write!(s, "{n} = ");
        }
        s.push_str(&profiles?.join(" + "));
        if let Some(c) = v.get("compute_slices").and_then(serde_json::Value::as_u64) {
            let _ = write!(s, " ({c}/7 compute slices)");
        }
        Some(s)
    }
    let Ok(value) = serde_json::from_str::<serde_json::Value>(v) else {
        return v.to_owned();
    };
    if let Some(s) = layout(&value) {
        return s;
    }
    if let Some(items) = value.as_array()
        && !items.is_empty()
        && let Some(all) = items.iter().map(layout).collect::<Option<Vec<_>>>()
    {
        return format!("[{}]", all.join(", "));
    }
    v.to_owned()
}

fn shorten(v: &str, max: usize) -> String {
    if v.chars().count() <= max {
        v.to_owned()
    } else {
        let cut: String = v.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// The terminal view: the header, the summary line, the changes, the decision note.
///
/// When the head is invalid it says so in one line; the caller prints the diagnostics with the
/// source lines above it (`tessera validate`'s renderer).
pub fn human(plan: &Plan, color: bool) -> String {
    let st = Style { color };
    let mut out = String::new();
    match &plan.base {
        Some(b) => {
            let _ = writeln!(out, "tessera plan: {} → {}", side(b), side(&plan.head));
            let _ = writeln!(out, "  base:  {}", validity(b, false));
        }
        None => {
            let _ = writeln!(out, "tessera plan: {}", side(&plan.head));
        }
    }
    let _ = writeln!(out, "  head:  {}", validity(&plan.head, true));
    let _ = writeln!(
        out,
        "  state: {} ({}){}",
        plan.state.path,
        shorten(&plan.state.digest, 19),
        if plan.valid {
            ", consistent with the head"
        } else {
            ""
        }
    );
    for r in &plan.state.replaces {
        let _ = writeln!(
            out,
            "         replaces ClusterState `{}` ({}:{}): the state file is the fleet as observed",
            r.name, r.file, r.line
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{}", st.bold(&plan.summary));
    if let Some(d) = &plan.policy {
        for g in groups(d) {
            if g.changes.is_empty() {
                continue;
            }
            let _ = writeln!(out);
            let _ = writeln!(out, "{}", st.bold(g.title));
            for c in g.changes {
                human_change(&st, c, &mut out);
            }
        }
    }
    let _ = writeln!(out);
    match (&plan.decisions.diff, &plan.decisions.reason) {
        (Some(d), _) => human_decisions(&st, d, plan.base.is_some(), &mut out),
        (None, Some(reason)) => {
            let _ = writeln!(out, "Decisions not compared: {reason}.");
        }
        (None, None) => {}
    }
    out
}

fn fate_text(f: &Fate) -> String {
    let mut s = f.outcome.clone();
    if let Some(p) = &f.pool {
        s.push_str(&format!(" in {p}"));
    }
    if !f.placement.is_empty() {
        s.push_str(&format!(" on {}", shorten(&f.placement.join(" "), 60)));
    }
    s
}

fn change_word(c: Change) -> &'static str {
    match c {
        Change::Admitted => "admitted",
        Change::Preempted => "preempted",
        Change::Moved => "moved",
        Change::Pending => "pending",
        Change::Appeared => "appears",
    }
}

fn human_decisions(st: &Style, d: &DecisionDiff, two_sides: bool, out: &mut String) {
    let title = if two_sides {
        "What the fleet would do (the state solved under each revision)"
    } else {
        "What the fleet would do (the state solved under this policy, against what runs now)"
    };
    let _ = writeln!(out, "{}", st.bold(title));
    if d.is_empty() {
        let _ = writeln!(out, "  no workload, GPU or tenant usage changes");
    }
    for w in &d.workloads {
        let _ = writeln!(
            out,
            "  {:<9} {} ({}): {} -> {}",
            change_word(w.change),
            w.name,
            w.tenant,
            fate_text(&w.before),
            fate_text(&w.after)
        );
        if let Some(lost) = w.after.lost_gpu_seconds {
            let _ = writeln!(
                out,
                "            loses {:.1} GPU-hours since its last checkpoint",
                lost / 3600.0
            );
        }
        if let Some(r) = &w.after.reason {
            let _ = writeln!(out, "            because {r}");
        }
    }
    for g in &d.geometry {
        let _ = writeln!(
            out,
            "  re-partition {} GPU {} ({}): [{}] -> [{}]{}",
            g.node,
            g.gpu,
            g.pool,
            g.before.join(" "),
            g.after.join(" "),
            if g.drain { ", after a drain" } else { "" }
        );
    }
    for u in &d.usage {
        let _ = writeln!(
            out,
            "  usage {} in {}: guaranteed {} -> {}, borrowed {} -> {}",
            u.tenant, u.pool, u.guaranteed.0, u.guaranteed.1, u.borrowed.0, u.borrowed.1
        );
    }
    for f in &d.fair_share {
        let _ = writeln!(out, "  fair share {}: {}", f.tenant, standing_text(f));
    }
    for p in &d.pools {
        let _ = writeln!(
            out,
            "  pool {}: allocation {:.2} % -> {:.2} %, stranded {} -> {} GPUs, free nodes {} -> {}",
            p.pool,
            p.allocation.0 * 100.0,
            p.allocation.1 * 100.0,
            p.stranded.0,
            p.stranded.1,
            p.free_nodes.0,
            p.free_nodes.1
        );
    }
}

fn human_change(st: &Style, c: &ItemChange, out: &mut String) {
    let fields: &[FieldChange] = match c {
        ItemChange::Added { name } => {
            let _ = writeln!(out, "  {} {name}", st.paint("32", "+"));
            &[]
        }
        ItemChange::Removed { name } => {
            let _ = writeln!(out, "  {} {name}", st.paint("31", "-"));
            &[]
        }
        ItemChange::Renamed { from, to } => {
            let _ = writeln!(out, "  {} {from} renamed to {to}", st.paint("36", "→"));
            &[]
        }
        ItemChange::Moved {
            name,
            from_parent,
            to_parent,
            fields,
        } => {
            let _ = writeln!(
                out,
                "  {} {name} moved from {} to {}",
                st.paint("36", "↷"),
                from_parent.as_deref().unwrap_or("(root)"),
                to_parent.as_deref().unwrap_or("(root)")
            );
            fields
        }
        ItemChange::Changed { name, fields } => {
            let _ = writeln!(out, "  {} {name}", st.paint("33", "~"));
            fields
        }
    };
    for f in fields {
        let _ = writeln!(
            out,
            "      {}: {} → {}",
            f.field,
            shorten(&readable(&f.before), HUMAN_VALUE_CHARS),
            shorten(&readable(&f.after), HUMAN_VALUE_CHARS)
        );
    }
}

/// Escapes text for a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\n', " ")
}

/// Inline code that survives any backticks in the value.
fn code(s: &str) -> String {
    let s = cell(s);
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

/// A pull-request comment (and `$GITHUB_STEP_SUMMARY`): the summary table first, each group's
/// details in a `<details>` section.
pub fn markdown(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### tessera plan");
    let _ = writeln!(out);
    let mark = if !plan.valid {
        "❌"
    } else if plan.changed {
        "📝"
    } else {
        "✅"
    };
    let _ = writeln!(out, "{mark} **{}**", cell(&plan.summary));
    let _ = writeln!(out);
    let _ = writeln!(out, "| | Revision | Commit | Policy |");
    let _ = writeln!(out, "|---|---|---|---|");
    let row = |label: &str, r: &Revision| {
        let mut rev = r.rev.clone().or_else(|| r.path.clone()).unwrap_or_default();
        if r.rev.is_some()
            && let Some(p) = &r.path
        {
            let _ = write!(rev, " at {p}/");
        }
        format!(
            "| {label} | {} | {} | {} |",
            code(&rev),
            short_commit(&r.commit)
                .map(code)
                .unwrap_or_else(|| "—".to_owned()),
            cell(&validity(r, label == "Head"))
        )
    };
    if let Some(b) = &plan.base {
        let _ = writeln!(out, "{}", row("Base", b));
    }
    let _ = writeln!(out, "{}", row("Head", &plan.head));
    let _ = writeln!(
        out,
        "| State | {} | {} | {} |",
        code(&plan.state.path),
        code(&shorten(&plan.state.digest, 19)),
        if plan.valid {
            "consistent with the head"
        } else {
            "checked with the head: see its diagnostics"
        }
    );
    for r in &plan.state.replaces {
        let _ = writeln!(
            out,
            "| | replaces `{}` | {} | the state file is the fleet as observed |",
            r.name,
            code(&format!("{}:{}", r.file, r.line))
        );
    }
    let _ = writeln!(out);

    if !plan.diagnostics.is_empty() {
        let errors = plan
            .diagnostics
            .iter()
            .filter(|d| d.severity == "error")
            .count();
        let _ = writeln!(
            out,
            "<details{}><summary>Head diagnostics ({})</summary>",
            if errors > 0 { " open" } else { "" },
            plan.diagnostics.len()
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "| Severity | Code | Where | Message |");
        let _ = writeln!(out, "|---|---|---|---|");
        for d in &plan.diagnostics {
            let place = match (&d.file, d.line, d.column) {
                (Some(f), Some(l), Some(c)) => code(&format!("{f}:{l}:{c}")),
                (Some(f), _, _) => code(f),
                _ => "—".to_owned(),
            };
            let mut message = d.message.clone();
            if let Some(h) = &d.help {
                message.push_str(" (help: ");
                message.push_str(h);
                message.push(')');
            }
            let _ = writeln!(
                out,
                "| {} | {} | {place} | {} |",
                d.severity,
                code(&format!("{} {}", d.code, d.name)),
                cell(&message)
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "</details>");
        let _ = writeln!(out);
    }

    if let Some(d) = &plan.policy
        && !d.is_empty()
    {
        let _ = writeln!(out, "| Policy | Added | Changed | Removed |");
        let _ = writeln!(out, "|---|---:|---:|---:|");
        for g in groups(d) {
            let c = crate::plan::Counts::of(g.changes);
            if c.total() == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                g.title,
                c.added,
                c.modified(),
                c.removed
            );
        }
        let _ = writeln!(out);
        for g in groups(d) {
            if g.changes.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "<details><summary>{} ({})</summary>",
                g.title,
                g.changes.len()
            );
            let _ = writeln!(out);
            let _ = writeln!(out, "| Name | Change | Field | Before | After |");
            let _ = writeln!(out, "|---|---|---|---|---|");
            for c in g.changes {
                markdown_change(plan, g.item, c, &mut out);
            }
            let _ = writeln!(out);
            let _ = writeln!(out, "</details>");
            let _ = writeln!(out);
        }
    }
    match (&plan.decisions.diff, &plan.decisions.reason) {
        (Some(d), _) => markdown_decisions(d, &mut out),
        (None, Some(reason)) => {
            let _ = writeln!(out, "> Decisions not compared: {}.", cell(reason));
        }
        (None, None) => {}
    }
    out
}

/// A collapsible table: `<details>` with the row count in its summary; nothing when empty.
fn details_table(out: &mut String, title: &str, header: &[&str], rows: &[Vec<String>]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "<details><summary>{title} ({})</summary>", rows.len());
    let _ = writeln!(out);
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "</details>");
    let _ = writeln!(out);
}

fn markdown_decisions(d: &DecisionDiff, out: &mut String) {
    let _ = writeln!(out, "#### What the fleet would do");
    let _ = writeln!(out);
    let _ = writeln!(out, "| Pool | Allocation | Stranded GPUs | Free nodes |");
    let _ = writeln!(out, "|---|---|---|---|");
    for p in &d.pools {
        let _ = writeln!(
            out,
            "| {} | {:.2} % → {:.2} % | {} → {} | {} → {} |",
            code(&p.pool),
            p.allocation.0 * 100.0,
            p.allocation.1 * 100.0,
            p.stranded.0,
            p.stranded.1,
            p.free_nodes.0,
            p.free_nodes.1
        );
    }
    let _ = writeln!(out);
    let workloads: Vec<Vec<String>> = d
        .workloads
        .iter()
        .map(|w| {
            let mut why = w.after.reason.clone().unwrap_or_default();
            if let Some(lost) = w.after.lost_gpu_seconds {
                why = format!("{why} (loses {:.1} GPU-hours)", lost / 3600.0);
            }
            vec![
                code(&w.name),
                cell(&w.tenant),
                change_word(w.change).to_owned(),
                cell(&fate_text(&w.before)),
                cell(&fate_text(&w.after)),
                cell(&why),
            ]
        })
        .collect();
    details_table(
        out,
        "Workloads",
        &["Workload", "Tenant", "Change", "Before", "After", "Why"],
        &workloads,
    );
    let geometry: Vec<Vec<String>> = d
        .geometry
        .iter()
        .map(|g| {
            vec![
                code(&format!("{}/{}", g.node, g.gpu)),
                code(&g.pool),
                cell(&g.before.join(" ")),
                cell(&g.after.join(" ")),
                if g.drain { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    details_table(
        out,
        "GPUs re-partitioned",
        &["GPU", "Pool", "Before", "After", "Drain"],
        &geometry,
    );
    let usage: Vec<Vec<String>> = d
        .usage
        .iter()
        .map(|u| {
            vec![
                code(&u.tenant),
                code(&u.pool),
                format!("{} → {}", u.guaranteed.0, u.guaranteed.1),
                format!("{} → {}", u.borrowed.0, u.borrowed.1),
            ]
        })
        .collect();
    details_table(
        out,
        "Tenant usage",
        &["Tenant", "Pool", "Guaranteed", "Borrowed"],
        &usage,
    );
    let fair: Vec<Vec<String>> = d
        .fair_share
        .iter()
        .map(|f| {
            let mut row = vec![code(&f.tenant)];
            row.extend(standing_fields(f, "→"));
            row
        })
        .collect();
    details_table(
        out,
        "Fair share (decayed usage and share of idle capacity)",
        &[
            "Tenant",
            "Weight",
            "GPU-hours used",
            "GPU-hours borrowed",
            "History",
            "Share",
        ],
        &fair,
    );
}

/// Weight, decayed GPU-hours used and borrowed, history and share; each `before → after` where
/// the revisions differ, the head's alone otherwise ("–" where a side has no setting).
fn standing_fields(f: &FairShareChange, arrow: &str) -> [String; 5] {
    let show: [fn(&Standing) -> String; 5] = [
        |s| format!("{}", s.weight),
        |s| format!("{:.1}", s.used_gpu_hours),
        |s| format!("{:.1}", s.borrowed_gpu_hours),
        |s| format!("{:.3}", s.history),
        |s| format!("{:.1} %", s.share * 100.0),
    ];
    show.map(|what| {
        let side = |s: &Option<Standing>| s.as_ref().map_or_else(|| "–".to_owned(), what);
        let (b, a) = (side(&f.before), side(&f.after));
        if f.before.is_none() || b == a {
            a
        } else {
            format!("{b} {arrow} {a}")
        }
    })
}

fn standing_text(f: &FairShareChange) -> String {
    let [weight, used, borrowed, history, share] = standing_fields(f, "->");
    format!(
        "weight {weight}, decayed GPU-hours used {used}, borrowed {borrowed}; history {history}, share of idle capacity {share}"
    )
}

fn markdown_change(plan: &Plan, item: &str, c: &ItemChange, out: &mut String) {
    let located = |name: &str| {
        plan.locations
            .iter()
            .find(|l| l.kind == item && l.name == name)
            .map(|l| {
                format!(
                    "{} ({})",
                    code(name),
                    code(&format!("{}:{}", l.file, l.line))
                )
            })
            .unwrap_or_else(|| code(name))
    };
    let (name, what, fields): (String, String, &[FieldChange]) = match c {
        ItemChange::Added { name } => (located(name), "added".into(), &[]),
        ItemChange::Removed { name } => (code(name), "removed".into(), &[]),
        ItemChange::Renamed { from, to } => {
            (located(to), format!("renamed from {}", code(from)), &[])
        }
        ItemChange::Moved {
            name,
            from_parent,
            to_parent,
            fields,
        } => (
            located(name),
            format!(
                "moved from {} to {}",
                code(from_parent.as_deref().unwrap_or("(root)")),
                code(to_parent.as_deref().unwrap_or("(root)"))
            ),
            fields,
        ),
        ItemChange::Changed { name, fields } => (located(name), "changed".into(), fields),
    };
    if fields.is_empty() {
        let _ = writeln!(out, "| {name} | {what} | | | |");
    }
    for (i, f) in fields.iter().enumerate() {
        let (n, w) = if i == 0 {
            (name.as_str(), what.as_str())
        } else {
            ("", "")
        };
        let _ = writeln!(
            out,
            "| {n} | {w} | {} | {} | {} |",
            code(&f.field),
            code(&readable(&f.before)),
            code(&readable(&f.after))
        );
    }
}

/// GitHub Actions workflow commands: the head's diagnostics as error/warning annotations, then
/// each located policy change as a notice on its document; at most [`MAX_ANNOTATIONS`] in all
/// (the rest counted in one line), then the summary as plain log lines. The full plan belongs
/// in the step summary (`--output markdown`).
pub fn github(plan: &Plan) -> String {
    let mut annotations = Vec::new();
    for d in &plan.diagnostics {
        let command = if d.severity == "error" {
            "error"
        } else {
            "warning"
        };
        let mut props = Vec::new();
        if let (Some(f), Some(l), Some(c)) = (&d.file, d.line, d.column) {
            props.push(format!("file={}", escape_property(f)));
            props.push(format!("line={l}"));
            props.push(format!("col={c}"));
        }
        props.push(format!(
            "title={}",
            escape_property(&format!("{} {}", d.code, d.name))
        ));
        let mut message = d.message.clone();
        if let Some(h) = &d.help {
            message.push_str("\nhelp: ");
            message.push_str(h);
        }
        annotations.push(format!(
            "::{command} {}::{}",
            props.join(","),
            escape_data(&message)
        ));
    }
    if let Some(d) = &plan.policy {
        for g in groups(d) {
            for c in g.changes {
                let Some((name, message)) = notice(c) else {
                    continue;
                };
                let Some(l) = plan
                    .locations
                    .iter()
                    .find(|l| l.kind == g.item && l.name == name)
                else {
                    continue;
                };
                annotations.push(format!(
                    "::notice file={},line={},title={}::{}",
                    escape_property(&l.file),
                    l.line,
                    escape_property(&format!("tessera plan: {} {name}", g.one)),
                    escape_data(&message)
                ));
            }
        }
    }
    let mut out = String::new();
    let total = annotations.len();
    for a in annotations.into_iter().take(MAX_ANNOTATIONS) {
        let _ = writeln!(out, "{a}");
    }
    if total > MAX_ANNOTATIONS {
        let _ = writeln!(
            out,
            "tessera plan: {} more not annotated (GitHub shows {MAX_ANNOTATIONS} per step); the step summary has them all",
            total - MAX_ANNOTATIONS
        );
    }
    let _ = writeln!(out, "tessera plan: {}", plan.summary);
    match (&plan.decisions.diff, &plan.decisions.reason) {
        (Some(d), _) => {
            let count = |c: Change| d.workloads.iter().filter(|w| w.change == c).count();
            let _ = writeln!(
                out,
                "tessera plan: the fleet would admit {}, preempt {}, move {}, leave {} pending, re-partition {} GPUs",
                count(Change::Admitted),
                count(Change::Preempted),
                count(Change::Moved),
                count(Change::Pending),
                d.geometry.len()
            );
        }
        (None, Some(reason)) => {
            let _ = writeln!(out, "tessera plan: decisions not compared: {reason}");
        }
        (None, None) => {}
    }
    out
}

/// The name a change is located by at the head, and what to say about it.
fn notice(c: &ItemChange) -> Option<(&str, String)> {
    let fields = |fs: &[FieldChange]| {
        fs.iter()
            .map(|f| {
                format!(
                    "{}: {} → {}",
                    f.field,
                    readable(&f.before),
                    readable(&f.after)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    Some(match c {
        ItemChange::Removed { .. } => return None,
        ItemChange::Added { name } => (name, "added".to_owned()),
        ItemChange::Renamed { from, to } => (to, format!("renamed from {from}")),
        ItemChange::Moved {
            name,
            from_parent,
            to_parent,
            fields: fs,
        } => {
            let mut m = format!(
                "moved from {} to {}",
                from_parent.as_deref().unwrap_or("(root)"),
                to_parent.as_deref().unwrap_or("(root)")
            );
            if !fs.is_empty() {
                m.push('\n');
                m.push_str(&fields(fs));
            }
            (name, m)
        }
        ItemChange::Changed { name, fields: fs } => (name, fields(fs)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_cells_cannot_break_the_table() {
        assert_eq!(cell("a|b\nc<d>"), "a\\|b c&lt;d&gt;");
        assert_eq!(code("x`y"), "`` x`y ``");
    }

    #[test]
    fn layouts_read_as_their_profiles() {
        let layout = r#"{"name":"halves","instances":[{"profile_id":5,"profile":"4g.40gb","start":0},{"profile_id":9,"profile":"3g.40gb","start":4}],"compute_slices":7}"#;
        assert_eq!(
            readable(layout),
            "halves = 4g.40gb + 3g.40gb (7/7 compute slices)"
        );
        assert_eq!(
            readable(&format!("[{layout}]")),
            "[halves = 4g.40gb + 3g.40gb (7/7 compute slices)]"
        );
        assert_eq!(readable("24.0"), "24.0");
        assert_eq!(readable("null"), "null");
    }

    #[test]
    fn long_values_are_shortened_on_the_terminal_only() {
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("abc", 3), "abc");
    }
}
