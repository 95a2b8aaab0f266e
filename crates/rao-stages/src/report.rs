//! A self-contained HTML report: the summary table and SVG plots (learning curve, success by
//! band for flat vs recursive, depth histogram). No scripts, no external files.

use std::collections::BTreeMap;

use crate::evaluate::EvalRow;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

const W: f64 = 520.0;
const H: f64 = 260.0;
const PAD: f64 = 40.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

fn frame(title: &str, body: &str, y_max: f64) -> String {
    let mut s = format!("<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' font-family='sans-serif' font-size='11'>");
    s.push_str(&format!("<text x='{}' y='16' font-size='13' font-weight='bold'>{}</text>", PAD, esc(title)));
    s.push_str(&format!("<line x1='{PAD}' y1='{}' x2='{}' y2='{}' stroke='#333'/>", H - PAD, W - 10.0, H - PAD));
    s.push_str(&format!("<line x1='{PAD}' y1='28' x2='{PAD}' y2='{}' stroke='#333'/>", H - PAD));
    for k in 0..=4 {
        let v = y_max * k as f64 / 4.0;
        let y = H - PAD - (H - PAD - 28.0) * k as f64 / 4.0;
        s.push_str(&format!(
            "<text x='4' y='{:.1}'>{v:.2}</text><line x1='{PAD}' y1='{y:.1}' x2='{}' y2='{y:.1}' stroke='#eee'/>",
            y + 4.0,
            W - 10.0
        ));
    }
    s.push_str(body);
    s.push_str("</svg>");
    s
}

/// Lines over iterations for the named series.
fn line_chart(title: &str, series: &[(&str, Vec<f64>)]) -> String {
    let n = series.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    if n == 0 {
        return format!("<p><em>{}: no training iterations recorded.</em></p>", esc(title));
    }
    let y_max = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(1.0f64, f64::max);
    let x = |i: usize| PAD + (W - PAD - 20.0) * if n > 1 { i as f64 / (n - 1) as f64 } else { 0.5 };
    let y = |v: f64| H - PAD - (H - PAD - 28.0) * (v / y_max).clamp(0.0, 1.0);
    let mut body = String::new();
    for (k, (name, vals)) in series.iter().enumerate() {
        let pts: Vec<String> = vals.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v))).collect();
        body.push_str(&format!("<polyline fill='none' stroke='{}' stroke-width='2' points='{}'/>", COLORS[k % 4], pts.join(" ")));
        body.push_str(&format!("<text x='{}' y='{}' fill='{}'>{}</text>", W - 150.0, 40.0 + 14.0 * k as f64, COLORS[k % 4], esc(name)));
    }
    body.push_str(&format!("<text x='{}' y='{}'>iteration (1–{n})</text>", W / 2.0 - 30.0, H - 8.0));
    frame(title, &body, y_max)
}

/// Grouped bars: one group per band, one bar per mode.
fn bar_chart(title: &str, groups: &[String], series: &[(String, Vec<f64>)], y_max: f64) -> String {
    let gw = (W - PAD - 20.0) / groups.len().max(1) as f64;
    let bw = gw * 0.8 / series.len().max(1) as f64;
    let mut body = String::new();
    for (g, name) in groups.iter().enumerate() {
        for (k, (_, vals)) in series.iter().enumerate() {
            let v = vals.get(g).copied().unwrap_or(0.0);
            let h = (H - PAD - 28.0) * (v / y_max).clamp(0.0, 1.0);
            let x = PAD + g as f64 * gw + gw * 0.1 + k as f64 * bw;
            body.push_str(&format!(
                "<rect x='{x:.1}' y='{:.1}' width='{:.1}' height='{h:.1}' fill='{}'><title>{v:.3}</title></rect>",
                H - PAD - h,
                bw - 2.0,
                COLORS[k % 4]
            ));
        }
        body.push_str(&format!("<text x='{:.1}' y='{}'>{}</text>", PAD + g as f64 * gw + gw * 0.3, H - PAD + 14.0, esc(name)));
    }
    for (k, (name, _)) in series.iter().enumerate() {
        body.push_str(&format!("<text x='{}' y='{}' fill='{}'>{}</text>", W - 120.0, 40.0 + 14.0 * k as f64, COLORS[k % 4], esc(name)));
    }
    frame(title, &body, y_max)
}

pub fn html(
    label: &str,
    rows: &[EvalRow],
    history: &[BTreeMap<String, f64>],
    depth_hist: &BTreeMap<String, BTreeMap<i32, usize>>,
) -> String {
    let mut s = format!(
        "<!doctype html><html><head><meta charset='utf-8'><title>rao report — {l}</title><style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f4f4f4}}td:nth-child(-n+3){{text-align:left}}</style></head><body><h1>rao evaluation — {l}</h1>",
        l = esc(label)
    );
    s.push_str("<h2>Held-out success</h2><table><tr><th>mode</th><th>band</th><th>label</th><th>tasks</th><th>success</th><th>95% CI</th><th>depth</th><th>nodes</th><th>steps</th><th>tokens</th><th>overflow</th><th>s/task</th></tr>");
    for r in rows {
        s.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>[{:.2}, {:.2}]</td><td>{:.2}</td><td>{:.1}</td><td>{:.1}</td><td>{:.0}</td><td>{:.2}</td><td>{:.4}</td></tr>",
            esc(&r.mode), esc(&r.band), esc(&r.label), r.tasks, r.success, r.ci_low, r.ci_high, r.mean_depth, r.mean_nodes, r.steps_per_task, r.tokens_per_task, r.overflow_rate, r.seconds_per_task
        ));
    }
    s.push_str("</table><h2>Plots</h2>");
    let col = |k: &str| history.iter().map(|h| h.get(k).copied().unwrap_or(0.0)).collect::<Vec<f64>>();
    s.push_str(&line_chart(
        "Learning curve (training rollouts)",
        &[("root success", col("root_success")), ("node success", col("node_success")), ("mean root reward", col("mean_root_reward"))],
    ));
    let bands: Vec<String> = {
        let mut b: Vec<String> = Vec::new();
        for r in rows {
            if !b.contains(&r.band) {
                b.push(r.band.clone());
            }
        }
        b
    };
    let modes: Vec<String> = {
        let mut m: Vec<String> = Vec::new();
        for r in rows {
            if !m.contains(&r.mode) {
                m.push(r.mode.clone());
            }
        }
        m
    };
    let series: Vec<(String, Vec<f64>)> = modes
        .iter()
        .map(|m| {
            (
                m.clone(),
                bands.iter().map(|b| rows.iter().find(|r| &r.mode == m && &r.band == b).map(|r| r.success).unwrap_or(0.0)).collect(),
            )
        })
        .collect();
    s.push_str(&bar_chart("Success by band: flat vs recursive", &bands, &series, 1.0));
    let depths: Vec<i32> =
        depth_hist.values().flat_map(|h| h.keys().copied()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let labels: Vec<String> = depths.iter().map(|d| format!("depth {d}")).collect();
    let series: Vec<(String, Vec<f64>)> =
        depth_hist.iter().map(|(m, h)| (m.clone(), depths.iter().map(|d| h.get(d).copied().unwrap_or(0) as f64).collect())).collect();
    let y_max = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(1.0, f64::max);
    s.push_str(&bar_chart("Tree depth histogram (trees per max depth)", &labels, &series, y_max));
    s.push_str("</body></html>\n");
    s
}
