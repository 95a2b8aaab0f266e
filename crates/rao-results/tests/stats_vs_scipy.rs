//! The comparison statistics agree with scipy (installed by scripts/test): Fisher's exact test,
//! Welch's t-test and the t-interval, on the cases a comparison meets (ties, zeros, small n).

use std::process::Command;

use rao_results::stats::{fisher_exact, t_interval, welch};

fn python() -> String {
    std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn p_values_and_intervals_match_scipy() {
    let fisher_cases: &[(u64, u64, u64, u64)] = &[
        (37, 40, 20, 40),
        (0, 40, 0, 40),
        (40, 40, 0, 40),
        (3, 6, 1, 6),
        (12, 40, 10, 40),
        (5, 10, 9, 12),
        (349, 800, 340, 800),
        (256, 800, 257, 800),
        (263, 800, 275, 800),
        (600, 800, 350, 800),
    ];
    let welch_cases: &[(&[f64], &[f64])] =
        &[(&[0.93, 0.90, 0.95], &[0.50, 0.48, 0.55]), (&[0.88, 0.88, 0.68], &[0.62, 0.50, 0.50]), (&[0.1, 0.2], &[0.15, 0.35, 0.05])];
    let interval_cases: &[&[f64]] = &[&[0.93, 0.90, 0.95], &[0.2, 0.6], &[1.0, 3.0, 2.0, 8.0]];
    let script = format!(
        "import json\nfrom scipy import stats\n\
         f = [stats.fisher_exact([[a, n1 - a], [b, n2 - b]])[1] for a, n1, b, n2 in {fisher}]\n\
         w = [stats.ttest_ind(a, b, equal_var=False).pvalue for a, b in {welch}]\n\
         i = [list(stats.t.interval(0.95, len(x) - 1, loc=stats.tmean(x), scale=stats.sem(x))) for x in {intervals}]\n\
         print(json.dumps({{'fisher': f, 'welch': w, 'interval': i}}))",
        fisher = serde_json::to_string(&fisher_cases.iter().map(|c| [c.0, c.1, c.2, c.3]).collect::<Vec<_>>()).unwrap(),
        welch = serde_json::to_string(&welch_cases.iter().map(|(a, b)| (a.to_vec(), b.to_vec())).collect::<Vec<_>>()).unwrap(),
        intervals = serde_json::to_string(&interval_cases.iter().map(|x| x.to_vec()).collect::<Vec<_>>()).unwrap(),
    );
    let out = Command::new(python()).arg("-c").arg(&script).output().expect("python runs");
    assert!(out.status.success(), "scipy (scripts/test installs it; set RAO_PYTHON):\n{}", String::from_utf8_lossy(&out.stderr));
    let want: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 + 1e-6 * b.abs();
    for (c, w) in fisher_cases.iter().zip(want["fisher"].as_array().unwrap()) {
        let p = fisher_exact(c.0, c.1, c.2, c.3).unwrap();
        assert!(close(p, w.as_f64().unwrap()), "fisher {c:?}: {p} vs scipy {w}");
    }
    for ((a, b), w) in welch_cases.iter().zip(want["welch"].as_array().unwrap()) {
        let p = welch(a, b).unwrap();
        assert!(close(p, w.as_f64().unwrap()), "welch {a:?} {b:?}: {p} vs scipy {w}");
    }
    for (x, w) in interval_cases.iter().zip(want["interval"].as_array().unwrap()) {
        let (_, lo, hi) = t_interval(x).unwrap();
        assert!(close(lo, w[0].as_f64().unwrap()) && close(hi, w[1].as_f64().unwrap()), "interval {x:?}: [{lo}, {hi}] vs scipy {w}");
    }
}
