//! The statistics of comparisons: intervals over seeds, and two-sided tests of a difference.
//! Distributions come from statrs; a test checks the p-values against scipy.

use statrs::distribution::{ContinuousCDF, Discrete, Hypergeometric, StudentsT};

/// Mean and 95% t-interval of per-seed values (`None` for fewer than two).
pub fn t_interval(values: &[f64]) -> Option<(f64, f64, f64)> {
    let n = values.len();
    if n < 2 {
        return None;
    }
    let (mean, var) = mean_var(values);
    let t = StudentsT::new(0.0, 1.0, (n - 1) as f64).ok()?.inverse_cdf(0.975);
    let half = t * (var / n as f64).sqrt();
    Some((mean, mean - half, mean + half))
}

fn mean_var(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var)
}

/// Welch's two-sided t-test of equal means (unequal variances); `None` below two values a side.
pub fn welch(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let ((ma, va), (mb, vb)) = (mean_var(a), mean_var(b));
    let (sa, sb) = (va / a.len() as f64, vb / b.len() as f64);
    if sa + sb == 0.0 {
        return Some(if ma == mb { 1.0 } else { 0.0 });
    }
    let t = (ma - mb) / (sa + sb).sqrt();
    let df = (sa + sb).powi(2) / (sa * sa / (a.len() as f64 - 1.0) + sb * sb / (b.len() as f64 - 1.0));
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    Some((2.0 * (1.0 - dist.cdf(t.abs()))).clamp(0.0, 1.0))
}

/// Fisher's exact two-sided test for successes `k1` of `n1` against `k2` of `n2`: the
/// probability, given the margins, of a table at most as likely as the one observed.
pub fn fisher_exact(k1: u64, n1: u64, k2: u64, n2: u64) -> Option<f64> {
    let (total, successes) = (n1 + n2, k1 + k2);
    let h = Hypergeometric::new(total, successes, n1).ok()?;
    // In logs: `pmf` divides binomial coefficients that overflow to infinity from a few hundred
    // tasks a side (800 trees: NaN, so every table seemed unlikelier than the observed one).
    let observed = h.ln_pmf(k1);
    let lo = successes.saturating_sub(n2);
    let hi = successes.min(n1);
    // Relative tolerance as in scipy: tables as likely as the observed one up to rounding count.
    let p: f64 = (lo..=hi).map(|k| h.ln_pmf(k)).filter(|&q| q <= observed + 1e-7_f64.ln_1p()).map(f64::exp).sum();
    p.is_finite().then_some(p.clamp(0.0, 1.0))
}

/// `**` below 0.01, `*` below 0.05.
pub fn mark(p: Option<f64>) -> &'static str {
    match p {
        Some(p) if p < 0.01 => "**",
        Some(p) if p < 0.05 => "*",
        _ => "",
    }
}
