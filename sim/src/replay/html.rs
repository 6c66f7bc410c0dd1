//! The replay as one self-contained HTML page: the figures in a table, and the plots as inline
//! SVG drawn by `plotters` (its SVG backend only: no fonts, bitmaps or JavaScript).
//!
//! Plotters lays text out with a font engine this build leaves out, so the plots carry no text
//! of their own: axis ranges and legends are written in HTML around each plot.

use std::fmt::Write;

use html_escape::encode_quoted_attribute as escape;
use plotters::prelude::*;

use super::report::{Summary, seconds};

/// Line colours, one per run (the solver's first).
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(127, 127, 127),
];

const WIDTH: u32 = 900;
const HEIGHT: u32 = 320;

fn hex(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// The allocation of every run over simulated time, 0 to 100 %.
fn allocation_plot(s: &Summary) -> Result<String, String> {
    let end = s
        .runs
        .iter()
        .map(|r| r.duration_seconds)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .build_cartesian_2d(0.0..end, 0.0..1.0)
            .map_err(|e| e.to_string())?;
        // Grid lines every 10 % of allocation and every tenth of the run.
        for i in 1..10 {
            let y = f64::from(i) / 10.0;
            chart
                .draw_series(LineSeries::new(
                    [(0.0, y), (end, y)],
                    RGBColor(230, 230, 230),
                ))
                .map_err(|e| e.to_string())?;
            let x = end * f64::from(i) / 10.0;
            chart
                .draw_series(LineSeries::new(
                    [(x, 0.0), (x, 1.0)],
                    RGBColor(230, 230, 230),
                ))
                .map_err(|e| e.to_string())?;
        }
        for (i, r) in s.runs.iter().enumerate() {
            let c = COLOURS[i % COLOURS.len()];
            // A step curve: each value holds until the next point.
            let mut points = Vec::with_capacity(r.allocation.len() * 2);
            for (k, p) in r.allocation.iter().enumerate() {
                if k > 0 {
                    points.push((p[0], r.allocation[k - 1][1]));
                }
                points.push((p[0], p[1]));
            }
            if i == 0 {
                chart
                    .draw_series(AreaSeries::new(points.clone(), 0.0, c.mix(0.15)))
                    .map_err(|e| e.to_string())?;
            }
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))
                .map_err(|e| e.to_string())?;
        }
        chart
            .draw_series(LineSeries::new(
                [(0.0, 0.0), (end, 0.0), (end, 1.0), (0.0, 1.0), (0.0, 0.0)],
                BLACK,
            ))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// Per tenant, for one run: its share of the GPU-hours (solid) beside its weight's (light).
fn share_plot(s: &Summary, run: usize) -> Result<String, String> {
    let r = &s.runs[run];
    let n = r.tenants.len().max(1);
    let top = r
        .tenants
        .iter()
        .map(|t| t.share.max(t.weight_share))
        .fold(0.0f64, f64::max)
        .max(0.01);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .build_cartesian_2d(0.0..n as f64, 0.0..top * 1.05)
            .map_err(|e| e.to_string())?;
        let c = COLOURS[run % COLOURS.len()];
        chart
            .draw_series(r.tenants.iter().enumerate().map(|(i, t)| {
                let x = i as f64;
                Rectangle::new([(x + 0.1, 0.0), (x + 0.5, t.share)], c.filled())
            }))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(r.tenants.iter().enumerate().map(|(i, t)| {
                let x = i as f64;
                Rectangle::new(
                    [(x + 0.5, 0.0), (x + 0.9, t.weight_share)],
                    c.mix(0.3).filled(),
                )
            }))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// The page.
pub fn page(s: &Summary) -> String {
    let mut out = String::new();
    let span = s.runs.first().map_or(0, |r| r.duration_seconds);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tessera simulate</title>\n<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}}table{{border-collapse:collapse}}td,th{{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}}td:first-child,th:first-child{{text-align:left}}.key span{{display:inline-block;width:14px;height:4px;margin:0 4px 3px 12px}}</style></head><body>\n<h1>Replay over time</h1>\n<p>{} workloads on {} nodes ({} GPUs), a cycle every {} s, {:.1} hours simulated.</p>\n",
        s.workloads,
        s.nodes,
        s.gpus,
        s.cycle_seconds,
        span as f64 / 3600.0
    );
    out.push_str("<table><tr><th></th>");
    for r in &s.runs {
        let _ = write!(out, "<th>{}</th>", escape(&r.placement));
    }
    out.push_str("</tr>\n");
    type Cell = dyn Fn(&super::RunReport) -> String;
    let rows: [(&str, Box<Cell>); 9] = [
        (
            "mean GPU allocation",
            Box::new(|r| format!("{:.2} %", r.mean_allocation * 100.0)),
        ),
        (
            "queueing delay p50",
            Box::new(|r| seconds(r.queueing_delay.p50)),
        ),
        (
            "queueing delay p99",
            Box::new(|r| seconds(r.queueing_delay.p99)),
        ),
        (
            "wait p99, waiting counted",
            Box::new(|r| seconds(r.waiting.p99)),
        ),
        ("never started", Box::new(|r| r.never_started.to_string())),
        ("preemptions", Box::new(|r| r.preemptions.to_string())),
        (
            "GPU-hours lost to preemption",
            Box::new(|r| format!("{:.1}", r.gpu_hours_lost)),
        ),
        (
            "MIG reconfigurations",
            Box::new(|r| r.reconfigurations.to_string()),
        ),
        ("cycles solved", Box::new(|r| r.cycles.to_string())),
    ];
    for (name, f) in &rows {
        let _ = write!(out, "<tr><td>{name}</td>");
        for r in &s.runs {
            let _ = write!(out, "<td>{}</td>", escape(&f(r)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n<h2>GPU allocation over time</h2>\n<p class=\"key\">");
    for (i, r) in s.runs.iter().enumerate() {
        let _ = write!(
            out,
            "<span style=\"background:{}\"></span>{}",
            hex(COLOURS[i % COLOURS.len()]),
            escape(&r.placement)
        );
    }
    let _ = writeln!(
        out,
        "</p><p>Vertical: 0 to 100 % of the fleet's GPUs, a line every 10 %. Horizontal: 0 to {:.1} hours, a line every tenth.</p>",
        span as f64 / 3600.0
    );
    match allocation_plot(s) {
        Ok(svg) => out.push_str(&svg),
        Err(e) => {
            let _ = write!(out, "<p>plot failed: {}</p>", escape(&e));
        }
    }
    for (i, r) in s.runs.iter().enumerate() {
        let _ = write!(
            out,
            "\n<h2>{}: fair share achieved against weights</h2>\n<p>Per tenant, left to right: its share of the GPU-hours used (solid) and its entitlement by weight (light).</p>\n",
            escape(&r.placement)
        );
        match share_plot(s, i) {
            Ok(svg) => out.push_str(&svg),
            Err(e) => {
                let _ = write!(out, "<p>plot failed: {}</p>", escape(&e));
            }
        }
        out.push_str("\n<table><tr><th>tenant</th><th>workloads</th><th>p50</th><th>p99</th><th>GPU-hours</th><th>share</th><th>weight</th><th>preempted</th></tr>\n");
        for t in &r.tenants {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1} %</td><td>{:.1} %</td><td>{}</td></tr>",
                escape(&t.tenant),
                t.workloads,
                seconds(t.queueing_delay.p50),
                seconds(t.queueing_delay.p99),
                t.gpu_hours,
                t.share * 100.0,
                t.weight_share * 100.0,
                t.preemptions
            );
        }
        out.push_str("</table>\n<table><tr><th>SLO class</th><th>workloads</th><th>started</th><th>p50</th><th>p99</th></tr>\n");
        for c in &r.slo_classes {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&c.slo_class),
                c.workloads,
                c.started,
                seconds(c.queueing_delay.p50),
                seconds(c.queueing_delay.p99)
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("</body></html>\n");
    out
}
