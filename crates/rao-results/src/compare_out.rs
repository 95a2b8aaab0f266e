//! A comparison as markdown (for READMEs and reviews), CSV (one row per cell, for spreadsheets
//! and pandas) or JSON (everything, parameters included).

use std::fmt::Write;

use serde_json::Value;

use crate::compare::{Cell, Comparison, EvalPoint, Metric};
use crate::stats;

/// `A`, `B`, … naming the pipelines in column headers.
fn letter(i: usize) -> String {
    if i < 26 { ((b'A' + i as u8) as char).to_string() } else { format!("P{}", i + 1) }
}

fn number(metric: Metric, v: f64) -> String {
    match metric {
        Metric::Success | Metric::MeanScore | Metric::OverflowRate | Metric::MeanDepth => format!("{v:.2}"),
        // Three significant digits below 0.1 s: paced latencies of a few milliseconds differ there.
        Metric::SecondsPerTask if v != 0.0 && v.abs() < 0.1 => {
            let places = (2 - v.abs().log10().floor() as i32) as usize;
            format!("{v:.places$}")
        }
        Metric::SecondsPerTask => format!("{v:.3}"),
        _ if v.abs() >= 100.0 => format!("{v:.0}"),
        _ => format!("{v:.1}"),
    }
}

/// A cell's mean, interval and mark; where fewer seeds than the `asked` have it, which ones.
fn shown(c: &Cell, asked: usize) -> String {
    let ci = c.ci.map(|(lo, hi)| format!(" [{}, {}]", number(c.metric, lo), number(c.metric, hi))).unwrap_or_default();
    let mark = stats::mark(c.p);
    let mark = if mark.is_empty() { String::new() } else { format!(" {mark}") };
    format!("{}{ci}{mark}{}", number(c.metric, c.value), seeds_note(c, asked))
}

/// ` (seeds 1, 3)` where fewer seeds than the `asked` have the cell; nothing where all do.
fn seeds_note(c: &Cell, asked: usize) -> String {
    match c.seeds.len() < asked {
        true => format!(
            " (seed{} {})",
            if c.seeds.len() == 1 { "" } else { "s" },
            c.seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        ),
        false => String::new(),
    }
}

fn value_text(v: &Option<Value>) -> String {
    match v {
        None => "—".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// How a Markdown comparison is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// A row per (evaluation, mode, band), a column per pipeline: for reading differences.
    #[default]
    Pipelines,
    /// A row per (pipeline, evaluation, mode), a column per band: the shape of a results table.
    Bands,
    /// A row per (pipeline, evaluation, mode, band), a column per seed and one for the mean: for
    /// settings whose effect differs from seed to seed.
    Seeds,
    /// A row per (pipeline, evaluation, mode, band) and seed, and their mean, a column per loop
    /// iteration: the learning curves of evaluations inside a loop (only those are shown) and
    /// the training curves asked for. Columns every `every` iterations; by default where the
    /// evaluations measured, else every 10th.
    Iterations { every: Option<u32> },
}

/// `brief`: the metric tables alone, without the list of pipelines, the parameters that differ
/// and the legend (for a document whose text says what A, B, … are); what is missing is still named.
pub fn markdown(cmp: &Comparison, layout: Layout, brief: bool) -> String {
    let mut s = if brief { String::new() } else { header(cmp) };
    let metrics: Vec<Metric> = Metric::ALL.into_iter().filter(|m| cmp.cells.iter().any(|c| c.metric == *m)).collect();
    if metrics.is_empty() && cmp.training.is_empty() && cmp.stage_values.is_empty() {
        s.push_str("\nNo evaluation results of these pipelines are in the store (compare reads what their `evaluate` stages measured).\n");
    }
    let columns = match layout {
        Layout::Iterations { every } => iteration_columns(cmp, every),
        _ => Vec::new(),
    };
    for m in metrics {
        match layout {
            Layout::Pipelines => by_pipeline(&mut s, cmp, m),
            Layout::Bands => by_band(&mut s, cmp, m),
            Layout::Seeds => by_seed(&mut s, cmp, m),
            Layout::Iterations { .. } => by_iteration(&mut s, cmp, m, &columns),
        }
    }
    if let Layout::Iterations { .. } = layout {
        training(&mut s, cmp, &columns);
    }
    stage_values(&mut s, cmp);
    if brief {
        missing(&mut s, cmp);
        return s.trim_start().to_string();
    }
    footer(&mut s, cmp, layout);
    s
}

/// The pipelines compared and the parameters where they differ.
fn header(cmp: &Comparison) -> String {
    let n = cmp.pipelines.len();
    let mut s = String::from("| | pipeline | file | seeds |\n|---|---|---|---|\n");
    for (i, (name, file, seeds)) in cmp.pipelines.iter().enumerate() {
        // A seed with an evaluation missing is named as such: the means below are over the others.
        let incomplete = |seed: u64| cmp.missing.iter().any(|m| m.arm == i && m.seed == seed);
        let seeds: Vec<String> =
            seeds.iter().map(|&seed| if incomplete(seed) { format!("{seed} (not all in the store)") } else { seed.to_string() }).collect();
        let _ = writeln!(s, "| {} | {} | `{}` | {} |", letter(i), md_escape(name), file, seeds.join(", "));
    }
    if !cmp.params.is_empty() {
        let _ = write!(s, "\n**Parameters that differ**\n\n| parameter |{}\n|---|{}\n", head(n), "---|".repeat(n));
        for d in &cmp.params {
            let vals: Vec<String> = d.values.iter().map(|v| format!(" {} |", md_escape(&value_text(v)))).collect();
            let _ = writeln!(s, "| `{}` |{}", d.path, vals.concat());
        }
    }
    s
}

/// Distinct values of `key` over the cells of `metric`, in the order they first appear.
fn distinct<'a, K: PartialEq>(cmp: &'a Comparison, metric: Metric, key: impl Fn(&'a Cell) -> K) -> Vec<K> {
    distinct_of(cmp.cells.iter().filter(|c| c.metric == metric), key)
}

/// Distinct keys of `items`, in the order they first appear.
fn distinct_of<T, K: PartialEq>(items: impl IntoIterator<Item = T>, key: impl Fn(T) -> K) -> Vec<K> {
    let mut keys = Vec::new();
    for item in items {
        let k = key(item);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

/// An evaluation's name (its instance: `heldout@10` in a loop) with the labels its cells carry.
fn evaluation_text(cells: &[&Cell], evaluation: &EvalPoint) -> String {
    let mut labels: Vec<&str> = cells.iter().map(|c| c.label.as_str()).collect();
    labels.dedup();
    format!("{} ({})", md_escape(&evaluation.to_string()), md_escape(&labels.join(" / ")))
}

fn by_pipeline(s: &mut String, cmp: &Comparison, m: Metric) {
    let n = cmp.pipelines.len();
    let _ = write!(s, "\n**{}**\n\n| evaluation | mode | band |{}\n|---|---|---|{}\n", m.name(), head(n), "---|".repeat(n));
    for (ev, mode, band) in distinct(cmp, m, |c| (c.point(), c.mode, c.band.as_str())) {
        let row: Vec<&Cell> = cmp.cells.iter().filter(|c| c.metric == m && c.point() == ev && c.mode == mode && c.band == band).collect();
        let cols: String = (0..n)
            .map(|a| {
                let asked = cmp.pipelines[a].2.len();
                let cell = row.iter().find(|c| c.arm == a);
                format!(" {} |", cell.map(|c| shown(c, asked)).unwrap_or_else(|| "—".into()))
            })
            .collect();
        let _ = writeln!(s, "| {} | {} | {} |{cols}", evaluation_text(&row, &ev), mode, md_escape(band));
    }
}

fn by_band(s: &mut String, cmp: &Comparison, m: Metric) {
    let bands = distinct(cmp, m, |c| c.band.as_str());
    let band_head: String = bands.iter().map(|b| format!(" {} |", md_escape(b))).collect();
    let _ = write!(s, "\n**{}**\n\n| | evaluation | mode |{band_head}\n|---|---|---|{}\n", m.name(), "---|".repeat(bands.len()));
    let mut rows = distinct(cmp, m, |c| (c.arm, c.point(), c.mode));
    rows.sort_by_key(|(arm, _, _)| *arm);
    for (arm, ev, mode) in rows {
        let row: Vec<&Cell> = cmp.cells.iter().filter(|c| c.metric == m && c.arm == arm && c.point() == ev && c.mode == mode).collect();
        let asked = cmp.pipelines[arm].2.len();
        let cols: String = bands
            .iter()
            .map(|b| format!(" {} |", row.iter().find(|c| c.band == *b).map(|c| shown(c, asked)).unwrap_or_else(|| "—".into())))
            .collect();
        let _ = writeln!(s, "| {} | {} | {} |{cols}", letter(arm), evaluation_text(&row, &ev), mode);
    }
}

/// Every seed asked of any pipeline, in the order first given.
fn all_seeds(cmp: &Comparison) -> Vec<u64> {
    distinct_of(cmp.pipelines.iter().flat_map(|(_, _, seeds)| seeds), |seed| *seed)
}

fn by_seed(s: &mut String, cmp: &Comparison, m: Metric) {
    let seeds = all_seeds(cmp);
    let seed_head: String = seeds.iter().map(|seed| format!(" seed {seed} |")).collect();
    let _ = write!(
        s,
        "\n**{}**\n\n| | evaluation | mode | band |{seed_head} mean |\n|---|---|---|---|{}---|\n",
        m.name(),
        "---|".repeat(seeds.len())
    );
    let mut rows: Vec<&Cell> = cmp.cells.iter().filter(|c| c.metric == m).collect();
    rows.sort_by_key(|c| c.arm);
    for c in rows {
        let cols: String = seeds
            .iter()
            .map(|seed| match c.seeds.iter().position(|s| s == seed) {
                Some(i) => format!(" {} |", number(m, c.per_seed[i])),
                None => " — |".into(),
            })
            .collect();
        let asked = cmp.pipelines[c.arm].2.len();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |{cols} {} |",
            letter(c.arm),
            evaluation_text(&[c], &c.point()),
            c.mode,
            md_escape(&c.band),
            shown(c, asked)
        );
    }
}

/// The iterations an `Iterations` layout has a column for: multiples of `every` (and the last
/// iteration); without it, those the evaluations measured, else every 10th (and the last).
fn iteration_columns(cmp: &Comparison, every: Option<u32>) -> Vec<u32> {
    let mut evaluated: Vec<u32> = cmp.cells.iter().filter_map(|c| c.iteration).collect();
    evaluated.sort_unstable();
    evaluated.dedup();
    if every.is_none() && !evaluated.is_empty() {
        return evaluated;
    }
    let trained = cmp.training.iter().flat_map(|t| t.points.iter().map(|(k, _)| *k));
    let last = evaluated.iter().copied().chain(trained).max().unwrap_or(0);
    let step = every.unwrap_or(10).max(1);
    let mut columns: Vec<u32> = (1..=last / step).map(|k| k * step).collect();
    if columns.last() != Some(&last) && last > 0 {
        columns.push(last);
    }
    columns
}

fn by_iteration(s: &mut String, cmp: &Comparison, m: Metric, iterations: &[u32]) {
    let points: Vec<&Cell> = cmp.cells.iter().filter(|c| c.metric == m && c.iteration.is_some()).collect();
    let head: String = iterations.iter().map(|i| format!(" {i} |")).collect();
    let _ = write!(
        s,
        "\n**{}**, after iteration\n\n| | evaluation | mode | band | seed |{head}\n|---|---|---|---|---|{}\n",
        m.name(),
        "---|".repeat(iterations.len())
    );
    let mut curves = distinct_of(points.iter().copied(), |c| (c.arm, c.evaluation.as_str(), c.mode, c.band.as_str()));
    curves.sort_by_key(|(arm, ..)| *arm);
    for (arm, ev, mode, band) in curves {
        let curve: Vec<&Cell> =
            points.iter().copied().filter(|c| c.arm == arm && c.evaluation == ev && c.mode == mode && c.band == band).collect();
        let at = |i: u32| curve.iter().find(|c| c.iteration == Some(i));
        let seeds: Vec<u64> = all_seeds(cmp).into_iter().filter(|seed| curve.iter().any(|c| c.seeds.contains(seed))).collect();
        let name = evaluation_text(&curve, &EvalPoint { stage: ev.to_string(), iteration: None });
        let mut row = |who: String, value: &dyn Fn(&Cell) -> Option<String>| {
            let cols: String =
                iterations.iter().map(|&i| format!(" {} |", at(i).and_then(|c| value(c)).unwrap_or_else(|| "—".into()))).collect();
            let _ = writeln!(s, "| {} | {name} | {mode} | {} | {who} |{cols}", letter(arm), md_escape(band));
        };
        for &seed in &seeds {
            row(format!("seed {seed}"), &|c| c.seeds.iter().position(|s| *s == seed).map(|k| number(m, c.per_seed[k])));
        }
        if seeds.len() > 1 {
            row("mean".into(), &|c| Some(format!("{}{}", number(m, c.value), seeds_note(c, seeds.len()))));
        }
    }
}

/// Training curves (`rollout.root_success`, …), a row per seed and their mean; a cell is the
/// metric's mean over the iterations since the column before (a short curve of a long run).
fn training(s: &mut String, cmp: &Comparison, iterations: &[u32]) {
    if cmp.training.is_empty() {
        return;
    }
    let head: String = iterations.iter().map(|i| format!(" {i} |")).collect();
    let _ = write!(
        s,
        "\n**training**, mean over the iterations up to\n\n| | metric | seed |{head}\n|---|---|---|{}\n",
        "---|".repeat(iterations.len())
    );
    let window = |points: &[(u32, f64)], k: usize| -> Option<f64> {
        let from = if k == 0 { 0 } else { iterations[k - 1] };
        let values: Vec<f64> = points.iter().filter(|(i, _)| *i > from && *i <= iterations[k]).map(|(_, v)| *v).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let mut curves = distinct_of(&cmp.training, |t| (t.arm, t.name.as_str()));
    curves.sort_by_key(|(arm, _)| *arm);
    for (arm, name) in curves {
        let seeds: Vec<&crate::compare::TrainingCurve> = cmp.training.iter().filter(|t| t.arm == arm && t.name == name).collect();
        for t in &seeds {
            let cols: String =
                (0..iterations.len()).map(|k| format!(" {} |", window(&t.points, k).map_or("—".into(), recorded_number))).collect();
            let _ = writeln!(s, "| {} | {} | seed {} |{cols}", letter(arm), md_escape(name), t.seed);
        }
        if seeds.len() > 1 {
            let cols: String = (0..iterations.len())
                .map(|k| {
                    let v: Vec<f64> = seeds.iter().filter_map(|t| window(&t.points, k)).collect();
                    format!(" {} |", mean_of_seeds(&v, seeds.len(), recorded_number))
                })
                .collect();
            let _ = writeln!(s, "| {} | {} | mean |{cols}", letter(arm), md_escape(name));
        }
    }
}

/// A value a stage recorded (a loss, a count, a rate), to a precision that suits its size.
fn recorded_number(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        a if a >= 0.1 || a == 0.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

/// A value a stage run once recorded, in a row that holds only whole numbers (`whole`: counts,
/// steps) or not: a rate to three places (a gate of 0.9 missed at 0.896 is not shown as 0.90).
fn stage_number(v: f64, whole: bool) -> String {
    match v.abs() {
        a if whole || a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.3}"),
    }
}

/// The mean of the seeds that have a value, saying how many of `seeds` they are when not all.
fn mean_of_seeds(values: &[f64], seeds: usize, number: impl Fn(f64) -> String) -> String {
    if values.is_empty() {
        return "—".into();
    }
    let mean = number(values.iter().sum::<f64>() / values.len() as f64);
    match values.len() < seeds {
        true => format!("{mean} ({} of {seeds} seeds)", values.len()),
        false => mean,
    }
}

/// Metrics of stages run once (`warmstart.steps`, …): a row per pipeline and metric, a column
/// per seed and their mean.
fn stage_values(s: &mut String, cmp: &Comparison) {
    let mut seeds = distinct_of(&cmp.stage_values, |v| v.seed);
    if seeds.is_empty() {
        return;
    }
    seeds.sort_unstable();
    let head: String = seeds.iter().map(|k| format!(" seed {k} |")).collect();
    let _ = write!(s, "\n**training**\n\n| | metric |{head} mean |\n|---|---|{}---|\n", "---|".repeat(seeds.len()));
    let mut rows = distinct_of(&cmp.stage_values, |v| (v.arm, v.name.as_str()));
    rows.sort_by_key(|(arm, _)| *arm);
    for (arm, name) in rows {
        let of_row: Vec<_> = cmp.stage_values.iter().filter(|v| v.arm == arm && v.name == name).collect();
        let value = |seed: u64| of_row.iter().find(|v| v.seed == seed).and_then(|v| v.value);
        let present: Vec<f64> = of_row.iter().filter_map(|v| v.value).collect();
        let whole = present.iter().all(|v| v.fract() == 0.0);
        let number = |v: f64| stage_number(v, whole);
        let cols: String = seeds.iter().map(|&k| format!(" {} |", value(k).map_or("—".into(), number))).collect();
        let _ = writeln!(s, "| {} | {} |{cols} {} |", letter(arm), md_escape(name), mean_of_seeds(&present, of_row.len(), number));
    }
}

fn footer(s: &mut String, cmp: &Comparison, layout: Layout) {
    if matches!(layout, Layout::Iterations { .. }) {
        s.push_str("\nA column is the evaluation after that iteration of its loop; a mean is over the seeds that have it.");
        if !cmp.training.is_empty() {
            s.push_str(" A training cell is its metric's mean over the iterations since the column before.");
        }
        s.push('\n');
    } else {
        s.push_str(
            "\nBrackets: 95% intervals — Wilson over the tasks for one seed's success rate, Student's t over seeds where there \
         are several. Marks: a difference from A, two-sided, * p < 0.05, ** p < 0.01 (Welch's t-test over seeds where both \
         have two or more, else Fisher's exact test on the tasks pooled over seeds; success only); not corrected for the \
         number of comparisons.\n",
        );
    }
    missing(s, cmp);
}

/// The runs a comparison lacks, each with the command that produces it.
fn missing(s: &mut String, cmp: &Comparison) {
    if !cmp.missing.is_empty() {
        s.push_str(
            "\nNot in the store yet (a cell names the seeds it has where some are missing; — where none); these commands produce them:\n\n",
        );
        for m in &cmp.missing {
            let _ = writeln!(s, "- {} ({}) seed {} ({}): `{}`", letter(m.arm), m.pipeline, m.seed, m.instances.join(", "), m.command);
        }
    }
}

fn head(n: usize) -> String {
    (0..n).map(|i| format!(" {} |", letter(i))).collect()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

pub fn csv(cmp: &Comparison) -> String {
    let mut s = String::from("pipeline,file,evaluation,label,mode,band,metric,seeds,value,ci_low,ci_high,p_vs_first,test,mark\n");
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for c in &cmp.cells {
        let (name, file, _) = &cmp.pipelines[c.arm];
        let seeds: Vec<String> = c.seeds.iter().map(u64::to_string).collect();
        let fields = [
            name.clone(),
            file.clone(),
            c.point().to_string(),
            c.label.clone(),
            c.mode.to_string(),
            c.band.clone(),
            c.metric.name().to_string(),
            seeds.join(" "),
            c.value.to_string(),
            opt(c.ci.map(|x| x.0)),
            opt(c.ci.map(|x| x.1)),
            opt(c.p),
            c.test.unwrap_or("").to_string(),
            stats::mark(c.p).to_string(),
        ];
        s.push_str(&fields.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(","));
        s.push('\n');
    }
    s
}

pub fn json(cmp: &Comparison) -> String {
    serde_json::to_string_pretty(cmp).expect("comparison serialises") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::TrainingCurve;

    fn with_training(curves: Vec<TrainingCurve>) -> Comparison {
        Comparison {
            pipelines: vec![("p".into(), "p.yaml".into(), vec![1, 2])],
            params: vec![],
            cells: vec![],
            training: curves,
            stage_values: vec![],
            missing: vec![],
        }
    }

    /// A training cell is the mean of the iterations since the column before; a seed that stopped
    /// early shows `—` there and the mean says how many seeds it is over.
    #[test]
    fn training_curves_average_each_window_of_iterations() {
        let curve = |seed, last: u32| TrainingCurve {
            arm: 0,
            seed,
            name: "rollout.root_success".into(),
            points: (1..=last).map(|k| (k, k as f64 / 10.0)).collect(),
        };
        let md = markdown(&with_training(vec![curve(1, 6), curve(2, 3)]), Layout::Iterations { every: Some(3) }, false);
        assert!(md.contains("| | metric | seed | 3 | 6 |\n"), "{md}");
        // Seed 1: (0.1 + 0.2 + 0.3) / 3 and (0.4 + 0.5 + 0.6) / 3.
        assert!(md.contains("| A | rollout.root_success | seed 1 | 0.20 | 0.50 |\n"), "{md}");
        assert!(md.contains("| A | rollout.root_success | seed 2 | 0.20 | — |\n"), "{md}");
        assert!(md.contains("| A | rollout.root_success | mean | 0.20 | 0.50 (1 of 2 seeds) |\n"), "{md}");
        // Without a step: every 10th iteration and the last.
        assert_eq!(iteration_columns(&with_training(vec![curve(1, 25)]), None), vec![10, 20, 25]);
    }

    #[test]
    fn latencies_of_milliseconds_keep_three_significant_digits() {
        let shown = |v| number(Metric::SecondsPerTask, v);
        assert_eq!(
            [shown(0.00481), shown(0.0141), shown(0.098), shown(0.25), shown(0.0)],
            ["0.00481", "0.0141", "0.0980", "0.250", "0.000"]
        );
    }

    /// A stage run once: a column per seed of any arm, `—` where an arm's seed is not in the
    /// store, and a mean over the seeds that are (saying so).
    #[test]
    fn values_of_stages_run_once_are_a_column_per_seed() {
        use crate::compare::StageValue;
        let value = |arm, seed, value| StageValue { arm, seed, name: "warmstart.steps".into(), value };
        let mut cmp = with_training(vec![]);
        cmp.pipelines.push(("q".into(), "q.yaml".into(), vec![1, 3]));
        cmp.stage_values = vec![value(0, 1, Some(1000.0)), value(0, 2, Some(2500.0)), value(1, 1, Some(0.25)), value(1, 3, None)];
        cmp.stage_values
            .extend([1.0, 0.875].map(|v| StageValue { name: "warmstart.gate".into(), ..value(0, 1 + (v < 1.0) as u64, Some(v)) }));
        let md = markdown(&cmp, Layout::Seeds, true);
        assert!(md.contains("| | metric | seed 1 | seed 2 | seed 3 | mean |\n"), "{md}");
        assert!(md.contains("| A | warmstart.steps | 1000 | 2500 | — | 1750 |\n"), "{md}");
        assert!(md.contains("| A | warmstart.gate | 1.000 | 0.875 | — | 0.938 |\n"), "a rate stays a rate where it is 1: {md}");
        assert!(md.contains("| B | warmstart.steps | 0.250 | — | — | 0.250 (1 of 2 seeds) |\n"), "{md}");
    }
}
