//! One self-contained HTML page per run: what ran (pipeline, seed, overrides, run id, date, code
//! version), every held-out evaluation with its intervals, success by band, depth and cost, and a
//! learning curve for every metric the loop recorded. No scripts, no external files: inline SVG.

use std::collections::BTreeMap;
use std::fmt::Write;

use rao_core::Mode;
use rao_stages::evaluate::EvalRow;

use crate::plots::{self, Axes, Bars, Line, Palette};
use crate::results::{Evaluation, RunResults};

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('\'', "&#39;").replace('"', "&quot;")
}

/// `2026-11-30 18:42 UTC`.
pub fn utc(secs: f64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0).map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string()).unwrap_or_default()
}

/// `14 min 13 s`.
pub fn duration(secs: f64) -> String {
    if secs < 10.0 {
        return format!("{secs:.1} s");
    }
    let s = secs.round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s} s"),
        (0, m, s) => format!("{m} min {s} s"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em auto;max-width:1180px;padding:0 1em;color:#222}\
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}h3{margin:1em 0 .3em;font-size:1.05em}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f4f4f4}td.l,th.l{text-align:left}table.meta td{text-align:left}\
.grid{display:flex;flex-wrap:wrap;gap:6px}.grid svg{border:1px solid #eee}.note{color:#666}.warn{color:#a33}";

/// Series name of an evaluation row: `label · mode`.
fn series_of(r: &EvalRow) -> String {
    format!("{} · {}", r.label, r.mode)
}

/// One hue per evaluation label; the flat mode in a lighter shade of it.
fn colour_of(palette: &mut Palette, label: &str, mode: Mode) -> plotters::style::RGBColor {
    if mode == Mode::Flat { palette.light(label) } else { palette.colour(label) }
}

pub fn page(res: &RunResults) -> String {
    let all_rows: Vec<&EvalRow> = res.evaluations.iter().flat_map(|e| e.rows.iter()).collect();
    let mut palette = Palette::new(all_rows.iter().map(|r| r.label.clone()));
    let title = match &res.run {
        Some(r) => format!("{} — run {}", res.pipeline, r.run_id),
        None => format!("{} — results in the store", res.pipeline),
    };
    let mut s = format!(
        "<!doctype html><html><head><meta charset='utf-8'><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>",
        t = esc(&title)
    );
    s.push_str(&meta(res));
    if !res.missing.is_empty() {
        let _ = write!(s, "<p class='warn'>{} stage instances are not in the store for this pipeline as given (", res.missing.len());
        let shown: Vec<String> = res.missing.iter().take(6).map(|(n, why)| format!("{}: {}", esc(n), esc(why))).collect();
        let _ = write!(
            s,
            "{}{}); run <code>rao run {}</code> to produce them.</p>",
            shown.join("; "),
            if res.missing.len() > 6 { "; …" } else { "" },
            esc(&res.file)
        );
    }
    // A pipeline without evaluations or a loop (plain shell stages, a data job): its stages.
    if all_rows.is_empty() && res.curves.is_empty() && !res.costs.is_empty() {
        s.push_str("<h2 id='stages'>Stages</h2>");
        s.push_str(&cost_table(res));
        s.push_str(&step_curves(res, &mut palette));
        s.push_str(&other_metrics(res));
        s.push_str("</body></html>\n");
        return s;
    }
    s.push_str("<h2 id='evaluation'>Held-out evaluation</h2>");
    if all_rows.is_empty() {
        s.push_str("<p class='note'>No evaluation in the store for this pipeline as given.</p>");
    } else {
        s.push_str(&eval_table(&res.evaluations));
        s.push_str(&by_band(&all_rows, &mut palette));
    }
    s.push_str("<h2 id='depth-cost'>Depth and cost</h2>");
    s.push_str(&depth_and_cost(&res.evaluations, &all_rows, &mut palette));
    s.push_str(&cost_table(res));
    s.push_str("<h2 id='learning-curves'>Learning curves</h2>");
    s.push_str(&step_curves(res, &mut palette));
    s.push_str(&learning_curves(res, &mut palette));
    s.push_str(&other_metrics(res));
    s.push_str("</body></html>\n");
    s
}

fn other_metrics(res: &RunResults) -> String {
    let mut s = String::new();
    if !res.metrics.is_empty() {
        s.push_str("<h2 id='other-metrics'>Other recorded metrics</h2><table><tr><th class='l'>instance</th><th class='l'>metric</th><th>value</th></tr>");
        for (i, m, v) in &res.metrics {
            let _ = write!(s, "<tr><td class='l'>{}</td><td class='l'>{}</td><td>{}</td></tr>", esc(i), esc(m), fmt_value(*v));
        }
        s.push_str("</table>");
    }
    s
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e12 { format!("{v:.0}") } else { format!("{v:.4}") }
}

fn meta(res: &RunResults) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("pipeline", format!("{} (<code>{}</code>)", esc(&res.pipeline), esc(&res.file))),
        ("seed", res.seed.to_string()),
        (
            "overrides",
            if res.overrides.is_empty() {
                "none".into()
            } else {
                res.overrides.iter().map(|o| format!("<code>--set {}</code>", esc(o))).collect::<Vec<_>>().join(" ")
            },
        ),
    ];
    match &res.run {
        Some(r) => {
            rows.push(("run", format!("{} ({})", esc(&r.run_id), esc(&r.status))));
            let took = r.finished_at.map(|f| format!(", took {}", duration(f - r.started_at))).unwrap_or_default();
            rows.push(("date", format!("{}{took}", utc(r.started_at))));
            rows.push((
                "code version",
                if r.code_version.is_empty() { "not recorded (a run from before rao kept it)".into() } else { esc(&r.code_version) },
            ));
            rows.push(("executor", esc(&r.executor)));
        }
        None => rows.push(("run", "no run record names these results".into())),
    }
    rows.push(("store", format!("<code>{}</code>", esc(&res.store))));
    let mut s = String::from("<table class='meta'>");
    for (k, v) in rows {
        let _ = write!(s, "<tr><th class='l'>{k}</th><td>{v}</td></tr>");
    }
    s.push_str("</table>");
    s
}

fn eval_table(evaluations: &[Evaluation]) -> String {
    let partial = evaluations.iter().flat_map(|e| &e.rows).any(|r| (r.mean_score - r.success).abs() > 1e-9);
    let mut s = String::from(
        "<table><tr><th class='l'>evaluation</th><th class='l'>mode</th><th class='l'>band</th><th>tasks</th><th>success</th><th>95% CI</th>",
    );
    if partial {
        s.push_str("<th>mean score</th>");
    }
    s.push_str("<th>depth</th><th>nodes</th><th>steps</th><th>tokens</th><th>overflow</th><th>s/task</th></tr>");
    for e in evaluations {
        for r in &e.rows {
            let _ = write!(
                s,
                "<tr><td class='l' title='{}'>{}</td><td class='l'>{}</td><td class='l'>{}</td><td>{}</td><td>{:.2}</td><td>[{:.2}, {:.2}]</td>",
                esc(&e.instance),
                esc(&r.label),
                r.mode,
                esc(&r.band),
                r.tasks,
                r.success,
                r.ci_low,
                r.ci_high
            );
            if partial {
                let _ = write!(s, "<td>{:.2}</td>", r.mean_score);
            }
            let _ = write!(
                s,
                "<td>{:.2}</td><td>{:.1}</td><td>{:.1}</td><td>{:.0}</td><td>{:.2}</td><td>{:.3}</td></tr>",
                r.mean_depth, r.mean_nodes, r.steps_per_task, r.tokens_per_task, r.overflow_rate, r.seconds_per_task
            );
        }
    }
    s.push_str("</table><p class='note'>95% CI: Wilson score interval over the tasks of the band (one attempt per task unless the evaluation's <code>group_size</code> says otherwise). Overflow: fraction of nodes that ran out of context.</p>");
    s
}

/// One bar series: its name, its first row (label and mode), its row per band.
type Series<'a> = (String, &'a EvalRow, Vec<Option<&'a EvalRow>>);

/// Bands in first-seen order, and one bar series per `label · mode`.
fn band_series<'a>(rows: &[&'a EvalRow]) -> (Vec<String>, Vec<Series<'a>>) {
    let mut bands: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        if !bands.contains(&r.band) {
            bands.push(r.band.clone());
        }
        if !names.contains(&series_of(r)) {
            names.push(series_of(r));
        }
    }
    let series = names
        .into_iter()
        .map(|n| {
            let first = rows.iter().copied().find(|r| series_of(r) == n).expect("a row of every series");
            let per_band = bands.iter().map(|b| rows.iter().copied().find(|r| series_of(r) == n && &r.band == b)).collect();
            (n, first, per_band)
        })
        .collect();
    (bands, series)
}

struct Chart<'a> {
    axes: Axes<'a>,
    size: &'a plots::Size,
    with_ci: bool,
    y_max: Option<f64>,
}

fn bar_chart(rows: &[&EvalRow], palette: &mut Palette, chart: Chart, value: &dyn Fn(&EvalRow) -> f64) -> String {
    let (bands, series) = band_series(rows);
    let bars: Vec<Bars> = series
        .iter()
        .map(|(name, first, per)| Bars {
            name,
            colour: colour_of(palette, &first.label, first.mode),
            values: per.iter().map(|r| r.map(value)).collect(),
            intervals: chart.with_ci.then(|| per.iter().map(|r| r.map(|r| (r.ci_low, r.ci_high))).collect()),
        })
        .collect();
    plots::bars(&chart.axes, chart.size, &bands, &bars, chart.y_max)
}

/// A chart of one value per band and series, half the page wide, its axis from 0.
fn half<'a>(title: &'a str, y: &'a str) -> Chart<'a> {
    Chart { axes: Axes { title, x: "band", y }, size: &plots::HALF, with_ci: false, y_max: None }
}

fn by_band(rows: &[&EvalRow], palette: &mut Palette) -> String {
    let success = Chart {
        axes: Axes { title: "Success by band (whiskers: 95% Wilson interval)", x: "band", y: "success rate" },
        size: &plots::WIDE,
        with_ci: true,
        y_max: Some(1.0),
    };
    let mut s = bar_chart(rows, palette, success, &|r| r.success);
    if rows.iter().any(|r| (r.mean_score - r.success).abs() > 1e-9) {
        let score = Chart {
            axes: Axes { title: "Mean root score by band", x: "band", y: "mean score" },
            size: &plots::WIDE,
            with_ci: false,
            y_max: Some(1.0),
        };
        s.push_str(&bar_chart(rows, palette, score, &|r| r.mean_score));
    }
    s
}

fn depth_and_cost(evaluations: &[Evaluation], rows: &[&EvalRow], palette: &mut Palette) -> String {
    let mut s = String::from("<div class='grid'>");
    if !rows.is_empty() {
        s.push_str(&bar_chart(rows, palette, half("Tree depth by band (mean of the deepest node)", "depth"), &|r| r.mean_depth));
        s.push_str(&bar_chart(rows, palette, half("Nodes per tree by band", "nodes"), &|r| r.mean_nodes));
        s.push_str(&bar_chart(rows, palette, half("Tokens per task by band (all nodes' contexts)", "tokens"), &|r| r.tokens_per_task));
        s.push_str(&bar_chart(rows, palette, half("Wall-clock per task by band", "seconds"), &|r| r.seconds_per_task));
    }
    // Depth histogram: trees per maximum depth, one series per `label · mode` (in the rows' order).
    let mut hist: Vec<(String, plotters::style::RGBColor, BTreeMap<i32, usize>)> = Vec::new();
    for e in evaluations {
        let label = e.rows.first().map(|r| r.label.clone()).unwrap_or_else(|| e.instance.clone());
        let mut modes: Vec<Mode> = e.depths.keys().copied().collect();
        modes.sort_by_key(|m| e.rows.iter().position(|r| r.mode == *m).unwrap_or(usize::MAX));
        for mode in modes {
            hist.push((format!("{label} · {mode}"), colour_of(palette, &label, mode), e.depths[&mode].clone()));
        }
    }
    if !hist.is_empty() {
        let depths: Vec<i32> =
            hist.iter().flat_map(|(_, _, h)| h.keys().copied()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let groups: Vec<String> = depths.iter().map(|d| d.to_string()).collect();
        let bars: Vec<Bars> = hist
            .iter()
            .map(|(name, colour, h)| Bars {
                name,
                colour: *colour,
                values: depths.iter().map(|d| Some(h.get(d).copied().unwrap_or(0) as f64)).collect(),
                intervals: None,
            })
            .collect();
        let axes = Axes { title: "Trees per maximum depth (all bands)", x: "depth of the deepest node", y: "trees" };
        s.push_str(&plots::bars(&axes, &plots::HALF, &groups, &bars, None));
    }
    s.push_str("</div>");
    s
}

fn cost_table(res: &RunResults) -> String {
    if res.costs.is_empty() {
        return String::new();
    }
    let total: f64 = res.costs.iter().map(|c| c.seconds).sum();
    let mut s = String::from(
        "<h3>Where the time went (each instance's own run, cached ones included)</h3><table><tr><th class='l'>stage</th><th class='l'>kind</th><th>instances</th><th>time</th><th>share</th><th class='l'>outputs</th></tr>",
    );
    for c in &res.costs {
        let _ = write!(
            s,
            "<tr><td class='l'>{}</td><td class='l'>{}</td><td>{}</td><td>{}</td><td>{:.0}%</td><td class='l'>{} ({})</td></tr>",
            esc(&c.stage),
            esc(&c.kind),
            c.instances,
            duration(c.seconds),
            100.0 * c.seconds / total.max(1e-9),
            esc(&c.outputs.join(", ")),
            bytes(c.bytes)
        );
    }
    let _ = write!(s, "<tr><th class='l'>total</th><td></td><td></td><th>{}</th><td></td><td></td></tr></table>", duration(total));
    s
}

/// `1.2 MB`, `340 B`.
fn bytes(n: u64) -> String {
    match n {
        0..1_000 => format!("{n} B"),
        1_000..1_000_000 => format!("{:.1} kB", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", n as f64 / 1e6),
        _ => format!("{:.1} GB", n as f64 / 1e9),
    }
}

/// Whether a metric is a rate, drawn on a shared 0–1 axis: its name says success or rate and
/// every value lies in [0, 1].
fn is_rate(metric: &str, mut values: impl Iterator<Item = f64>) -> bool {
    (metric.contains("success") || metric.ends_with("rate")) && values.all(|v| (0.0..=1.0).contains(&v))
}

fn learning_curves(res: &RunResults, palette: &mut Palette) -> String {
    if res.curves.is_empty() {
        return "<p class='note'>No loop iterations in the store for this pipeline as given.</p>".into();
    }
    let mut s = format!(
        "<p class='note'>Every metric the loop's stages recorded, per iteration; a stage's rates share one chart on a 0–1 axis. Curves longer than {} points: faint dots for each iteration, the line a trailing mean over {}.</p>",
        plots::SMOOTH_FROM,
        plots::SMOOTH_WINDOW
    );
    let mut series: Vec<&str> = Vec::new();
    for c in &res.curves {
        if !series.contains(&c.series.as_str()) {
            series.push(&c.series);
        }
    }
    for name in series {
        let curves = res.curves.iter().filter(|c| c.series == name);
        let named = curves.map(|c| (c.metric.as_str(), c.points.iter().map(|p| (p.iteration as f64, p.value)).collect()));
        s.push_str(&curve_group(&format!("{name} (per iteration)"), name, "iteration", named.collect(), palette));
    }
    s
}

/// One series' curves under a heading: its rates on one 0–1 chart, each other metric alone.
fn curve_group<'a>(heading: &str, name: &str, x: &str, curves: Vec<(&'a str, Vec<(f64, f64)>)>, palette: &mut Palette) -> String {
    let mut s = format!("<h3>{}</h3><div class='grid'>", esc(heading));
    let (rates, others): (Vec<_>, Vec<_>) = curves.into_iter().partition(|(metric, points)| is_rate(metric, points.iter().map(|p| p.1)));
    let mut line =
        |(metric, points): (&'a str, Vec<(f64, f64)>)| Line {
            name: metric, colour: palette.colour(&format!("{name} · {metric}")), points
        };
    if !rates.is_empty() {
        let title = format!("{name} · rates");
        let lines: Vec<Line> = rates.into_iter().map(&mut line).collect();
        s.push_str(&plots::lines_in(&Axes { title: &title, x, y: "rate" }, &plots::SMALL, &lines, Some((0.0, 1.0))));
    }
    for curve in others {
        let one = line(curve);
        let title = format!("{name} · {}", one.name);
        s.push_str(&plots::lines(&Axes { title: &title, x, y: one.name }, &plots::SMALL, std::slice::from_ref(&one)));
    }
    s.push_str("</div>");
    s
}

/// The curves stages recorded while they ran (the warm start's loss and gate checks), by step.
fn step_curves(res: &RunResults, palette: &mut Palette) -> String {
    let mut s = String::new();
    let mut instances: Vec<&str> = Vec::new();
    for c in &res.step_curves {
        if !instances.contains(&c.instance.as_str()) {
            instances.push(&c.instance);
        }
    }
    for name in instances {
        let curves = res.step_curves.iter().filter(|c| c.instance == name);
        let named = curves.map(|c| (c.metric.as_str(), c.points.iter().map(|&(x, y)| (x as f64, y)).collect()));
        s.push_str(&curve_group(&format!("{name} (per step)"), name, "step", named.collect(), palette));
    }
    s
}
