//! HTML from a [`FleetPage`]: pure functions, one pass over the data into one `String`.
//!
//! Every string from the repository or a tenant goes through [`push_text`]. The page holds no
//! script; the service also sends a Content-Security-Policy that allows none.
//!
//! Each node is one compact row with its own small SVG (GPUs side by side, each on its
//! memory-slice grid), so a 4,000-GPU fleet is 500 rows a browser lays out quickly rather than
//! one giant drawing.

use std::fmt::Write as _;

use tessera_compiler::model::Health;
use tessera_compiler::units::{Gpus, format_rfc3339};
use tessera_mig::shape::MEMORY_SLICES;

use super::html::push_text;
use super::model::{Block, FleetPage, GpuView, Holder, NodeView, PoolView, UsageLine, Waiting};
use crate::metering::report::gpu_hours;

/// Pixels per memory slice, and around each GPU.
const SLICE_PX: u32 = 8;
const GPU_GAP_PX: u32 = 6;
const ROW_PX: u32 = 18;

const STYLE: &str = "body{font:13px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}\
h1{font-size:20px;margin:0}h2{font-size:16px;margin:1.4em 0 .4em;border-bottom:1px solid #ccc}\
h3{font-size:14px;margin:1em 0 .3em}table{border-collapse:collapse}\
td,th{padding:1px 8px 1px 0;text-align:left;vertical-align:middle}\
th{font-weight:600}table.nodes td,table.nodes th{padding:0 8px 0 0;white-space:nowrap}\
td.who{white-space:normal;color:#444;font-size:12px}\
.bad{color:#b00020}.muted{color:#777}svg{display:block}\
.f{fill:#eef0f2;stroke:#aab}.lost{fill:#fdd;stroke:#b00020}\
.i{fill:#fff;stroke:#99a}.o{fill:#9aa3ad}pre{background:#f6f6f6;padding:.5em}\
header{display:flex;justify-content:space-between;align-items:baseline}\
form.out{display:inline}";

/// The fleet page.
pub fn page(p: &FleetPage) -> String {
    let gpus: usize = p
        .pools
        .iter()
        .flat_map(|pool| &pool.nodes)
        .map(|n| n.gpus.len())
        .sum();
    // About 400 bytes a GPU and 300 a waiting workload: one allocation for the page.
    let mut out = String::with_capacity(16_384 + gpus * 400 + p.queue.len() * 300);
    out.push_str("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<title>tessera fleet</title><style>");
    out.push_str(STYLE);
    out.push_str("</style></head><body><header><h1>tessera fleet</h1><p>Signed in as ");
    push_text(&mut out, &p.viewer);
    out.push_str(" · page made ");
    push_text(&mut out, &p.generated_at);
    out.push_str(
        " <form class=\"out\" method=\"post\" action=\"/ui/logout\">\
         <button type=\"submit\">Sign out</button></form></p></header>",
    );
    status(&mut out, p);
    pools(&mut out, p);
    queue(&mut out, &p.queue);
    usage(&mut out, p);
    out.push_str("</body></html>\n");
    out
}

fn status(out: &mut String, p: &FleetPage) {
    let s = &p.status;
    out.push_str("<section id=\"status\"><h2>Revision and health</h2><table>");
    row(out, "Sync", s.sync);
    let health_class = if s.health == "Degraded" {
        " class=\"bad\""
    } else {
        ""
    };
    let _ = write!(out, "<tr><th>Health</th><td{health_class}>{}", s.health);
    if s.suspended {
        out.push_str(" (suspended: nothing is applied until resumed)");
    }
    out.push_str("</td></tr>");
    row(
        out,
        "Revision applied",
        s.revision.as_deref().unwrap_or("none yet"),
    );
    row(out, "Branch head", s.head.as_deref().unwrap_or("unknown"));
    let cycle = match &s.last_cycle_at {
        Some(at) => format!("{at} (cycle {})", s.cycles),
        None => "none yet".to_string(),
    };
    row(out, "Last cycle", &cycle);
    row(
        out,
        "Fleet observed",
        &p.observed_at
            .map_or_else(|| "not yet".to_owned(), format_rfc3339),
    );
    row(
        out,
        "Last decision",
        &p.decided_at
            .map_or_else(|| "none yet".to_owned(), format_rfc3339),
    );
    out.push_str("</table>");
    if !s.conditions.is_empty() {
        out.push_str("<h3 class=\"bad\">Last error</h3><ul id=\"conditions\">");
        for c in &s.conditions {
            out.push_str("<li>");
            push_text(out, c);
            out.push_str("</li>");
        }
        out.push_str("</ul>");
    }
    if !s.diagnostics.is_empty() {
        out.push_str(
            "<h3 class=\"bad\">Diagnostics of the rejected revision</h3><pre id=\"diagnostics\">",
        );
        for d in &s.diagnostics {
            push_text(out, d);
            out.push('\n');
        }
        out.push_str("</pre>");
    }
    if !s.lost_gpus.is_empty() {
        out.push_str("<p class=\"bad\">Lost GPUs: ");
        push_text(out, &s.lost_gpus.join(", "));
        out.push_str("</p>");
    }
    out.push_str("</section>");
}

fn row(out: &mut String, header: &str, value: &str) {
    out.push_str("<tr><th>");
    out.push_str(header);
    out.push_str("</th><td>");
    push_text(out, value);
    out.push_str("</td></tr>");
}

fn pools(out: &mut String, p: &FleetPage) {
    out.push_str("<section id=\"pools\"><h2>Pools and nodes</h2>");
    if p.pools.is_empty() {
        out.push_str("<p class=\"muted\">No fleet observed yet.</p>");
    } else {
        out.push_str(
            "<p class=\"muted\">Each GPU is drawn on its 8 memory slices (where MIG instances \
             are placed): a coloured block is taken (hover for who), a white one is a free \
             instance, grey without a block is a GPU's unpartitioned free space.</p>",
        );
    }
    for pool in &p.pools {
        pool_section(out, pool);
    }
    out.push_str("</section>");
}

fn pool_section(out: &mut String, pool: &PoolView) {
    let gpus: usize = pool.nodes.iter().map(|n| n.gpus.len()).sum();
    out.push_str("<h3>Pool ");
    push_text(out, &pool.name);
    let nodes = pool.nodes.len();
    let _ = write!(
        out,
        "</h3><p>{nodes} node{}, {gpus} GPU{}",
        plural(nodes),
        plural(gpus)
    );
    if let (Some(capacity), Some(allocated)) = (pool.capacity, pool.allocated) {
        let _ = write!(
            out,
            "; {allocated} of {capacity} allocated by the last decision"
        );
    }
    out.push_str("</p><table class=\"nodes\"><tbody>");
    for node in &pool.nodes {
        node_row(out, node);
    }
    out.push_str("</tbody></table>");
}

fn node_row(out: &mut String, node: &NodeView) {
    out.push_str("<tr><th>");
    push_text(out, &node.name);
    if node.health != Health::Healthy {
        let _ = write!(out, " <span class=\"bad\">({})</span>", health(node.health));
    }
    let width = node.gpus.len() as u32 * (u32::from(MEMORY_SLICES) * SLICE_PX + GPU_GAP_PX);
    let _ = write!(
        out,
        "</th><td><svg width=\"{width}\" height=\"{ROW_PX}\" role=\"img\">"
    );
    for (i, gpu) in node.gpus.iter().enumerate() {
        gpu_svg(out, &node.name, gpu, i as u32);
    }
    out.push_str("</svg></td><td class=\"who\">");
    // Who runs here, each named once, in order.
    let mut named: Vec<(&str, &str)> = Vec::new();
    let mut others = false;
    for block in node.gpus.iter().flat_map(|g| &g.blocks) {
        for h in &block.holders {
            match h {
                Holder::Workload { tenant, name } => {
                    if !named.contains(&(tenant.as_str(), name.as_str())) {
                        named.push((tenant, name));
                    }
                }
                Holder::Other => others = true,
            }
        }
    }
    for (i, (tenant, name)) in named.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_text(out, tenant);
        out.push('/');
        push_text(out, name);
    }
    if others {
        out.push_str(if named.is_empty() { "" } else { ", " });
        out.push_str("<span class=\"muted\">other tenants' work</span>");
    }
    out.push_str("</td></tr>");
}

fn gpu_svg(out: &mut String, node: &str, gpu: &GpuView, i: u32) {
    let x0 = i * (u32::from(MEMORY_SLICES) * SLICE_PX + GPU_GAP_PX);
    let frame = if gpu.health == Health::Lost {
        "lost"
    } else {
        "f"
    };
    let _ = write!(
        out,
        "<rect class=\"{frame}\" x=\"{x0}\" y=\"1\" width=\"{}\" height=\"{}\"><title>",
        u32::from(MEMORY_SLICES) * SLICE_PX,
        ROW_PX - 2
    );
    push_text(out, node);
    let _ = write!(out, " GPU {} · ", gpu.index);
    push_text(out, &gpu.model);
    if gpu.mig {
        out.push_str(" · MIG");
    }
    if gpu.health != Health::Healthy {
        let _ = write!(out, " · {}", health(gpu.health));
    }
    out.push_str("</title></rect>");
    for block in &gpu.blocks {
        block_svg(out, gpu, block, x0);
    }
}

fn block_svg(out: &mut String, gpu: &GpuView, block: &Block, x0: u32) {
    // A whole GPU nobody holds is left as the frame's free grey.
    if block.profile.is_none() && block.holders.is_empty() {
        return;
    }
    let x = x0 + u32::from(block.start) * SLICE_PX + 1;
    let width = (u32::from(block.slices) * SLICE_PX).saturating_sub(2);
    out.push_str("<rect ");
    match block.holders.first() {
        None => out.push_str("class=\"i\""),
        Some(Holder::Other) => out.push_str("class=\"o\""),
        Some(Holder::Workload { tenant, .. }) => {
            let _ = write!(out, "fill=\"hsl({},55%,62%)\"", hue(tenant));
        }
    }
    let _ = write!(
        out,
        " x=\"{x}\" y=\"3\" width=\"{width}\" height=\"{}\"><title>GPU {}",
        ROW_PX - 6,
        gpu.index
    );
    if let Some(profile) = &block.profile {
        out.push_str(" · ");
        push_text(out, profile);
    }
    if block.holders.is_empty() {
        out.push_str(" · free");
    }
    for h in &block.holders {
        out.push_str(" · ");
        match h {
            Holder::Workload { tenant, name } => {
                push_text(out, tenant);
                out.push('/');
                push_text(out, name);
            }
            Holder::Other => out.push_str("another tenant's workload"),
        }
    }
    out.push_str("</title></rect>");
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn health(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Degraded => "degraded",
        Health::Lost => "lost",
    }
}

/// A tenant's colour: the same on every page and every fleet (FNV-1a of its name).
fn hue(tenant: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in tenant.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % 360
}

fn queue(out: &mut String, queue: &[Waiting]) {
    out.push_str("<section id=\"queue\"><h2>Queue</h2>");
    if queue.is_empty() {
        out.push_str("<p class=\"muted\">Nothing is waiting.</p></section>");
        return;
    }
    let _ = write!(
        out,
        "<p>{} waiting, in the order the next decision considers them.</p>\
         <table><thead><tr><th>Place</th><th>Workload</th><th>Pool</th><th>Reason</th>\
         <th>Why</th></tr></thead><tbody>",
        queue.len()
    );
    for w in queue {
        out.push_str("<tr><td>");
        match w.position {
            Some((position, of)) => {
                let _ = write!(out, "{position} of {of}");
            }
            None => out.push_str("<span class=\"muted\">not in line</span>"),
        }
        out.push_str("</td><td>");
        push_text(out, &w.tenant);
        out.push('/');
        push_text(out, &w.name);
        out.push_str("</td><td>");
        push_text(out, w.pool.as_deref().unwrap_or("-"));
        out.push_str("</td><td>");
        push_text(out, &w.reason);
        out.push_str("</td><td>");
        push_text(out, &w.message);
        out.push_str("</td></tr>");
    }
    out.push_str("</tbody></table></section>");
}

fn usage(out: &mut String, p: &FleetPage) {
    out.push_str("<section id=\"usage\"><h2>Usage against guarantee and limit</h2>");
    if p.usage.is_empty() {
        out.push_str("<p class=\"muted\">No decision yet.</p></section>");
        return;
    }
    out.push_str("<p>GPUs after the last decision (a tenant counts its subtree): the bar is ");
    out.push_str("in use (green within the guarantee, orange borrowed), the black mark the ");
    out.push_str("guarantee, the bar's end the limit.");
    if let Some((since, until)) = &p.metered {
        out.push_str(" GPU-hours metered from ");
        push_text(out, since);
        out.push_str(" to ");
        push_text(out, until);
        out.push('.');
    }
    out.push_str(
        "</p><table><thead><tr><th>Tenant</th><th>Pool</th><th>In use</th><th>Guarantee</th>\
         <th>Limit</th><th>Borrowed</th><th></th><th>GPU-hours, last day</th></tr></thead><tbody>",
    );
    for line in &p.usage {
        usage_row(out, line);
    }
    out.push_str("</tbody></table></section>");
}

fn usage_row(out: &mut String, u: &UsageLine) {
    out.push_str("<tr><td>");
    push_text(out, &u.tenant);
    out.push_str("</td><td>");
    push_text(out, &u.pool);
    let _ = write!(
        out,
        "</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>",
        u.total, u.guarantee, u.limit, u.borrowed
    );
    usage_bar(out, u);
    out.push_str("</td><td>");
    match u.day_unit_seconds {
        Some(s) => out.push_str(&gpu_hours(s)),
        None => out.push_str("<span class=\"muted\">-</span>"),
    }
    out.push_str("</td></tr>");
}

/// In use against guarantee and limit, on a scale that fits all three.
fn usage_bar(out: &mut String, u: &UsageLine) {
    const W: f64 = 160.0;
    let scale = [u.limit, u.total, u.guarantee, Gpus::whole(1)]
        .into_iter()
        .map(Gpus::as_f64)
        .fold(0.0, f64::max);
    let px = |g: Gpus| (g.as_f64() / scale * W).clamp(0.0, W);
    let within = px(u.total.saturating_sub(u.borrowed));
    let borrowed = px(u.borrowed);
    let _ = write!(
        out,
        "<svg width=\"{W}\" height=\"12\" role=\"img\"><rect class=\"f\" x=\"0\" y=\"1\" \
         width=\"{:.1}\" height=\"10\"/><rect fill=\"#4caf50\" x=\"0\" y=\"2\" width=\"{within:.1}\" \
         height=\"8\"/><rect fill=\"#ff9800\" x=\"{within:.1}\" y=\"2\" width=\"{borrowed:.1}\" \
         height=\"8\"/><rect fill=\"#000\" x=\"{:.1}\" y=\"0\" width=\"2\" height=\"12\"/></svg>",
        px(u.limit).max(1.0),
        (px(u.guarantee) - 1.0).max(0.0),
    );
}

/// The login page: a form that posts the token (never a URL that carries it).
pub fn login(error: Option<&str>) -> String {
    let mut out = String::with_capacity(2048);
    out.push_str("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<title>tessera fleet: sign in</title><style>");
    out.push_str(STYLE);
    out.push_str("</style></head><body><h1>tessera fleet</h1>");
    if let Some(e) = error {
        out.push_str("<p class=\"bad\" id=\"error\">");
        push_text(&mut out, e);
        out.push_str("</p>");
    }
    out.push_str(
        "<form method=\"post\" action=\"/ui/login\"><p><label>Token (the operator's or your \
         tenant's, as for the API)<br><input type=\"password\" name=\"token\" \
         autocomplete=\"off\" size=\"70\" required></label></p><p><button type=\"submit\">\
         Sign in</button></p></form><p class=\"muted\">Scripts: <code>curl -X POST -H \
         'Authorization: Bearer TOKEN' URL/v1/ui/links</code> returns a one-time link, good \
         for 60 seconds.</p></body></html>\n",
    );
    out
}
