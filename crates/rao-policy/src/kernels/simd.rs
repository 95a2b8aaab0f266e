//! Plain loops compiled three ways (AVX-512, AVX2+FMA, baseline) and picked at run time, so LLVM
//! vectorises them for the CPU at hand without building the crate for one CPU; and an `exp`
//! written so that those loops vectorise (libm's `expf` is a scalar call).

/// Defines `fn NAME(args)` that runs its body compiled for the best instruction set the CPU has.
/// The body must be plain safe code; only the dispatch is `unsafe`.
macro_rules! simd_fn {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                if $crate::kernels::simd::has_avx512() {
                    // SAFETY: the CPU supports every feature the function was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if $crate::kernels::simd::has_avx2() {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use simd_fn;

#[cfg(target_arch = "x86_64")]
pub fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl") && has_avx2()
}

#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// `e^x` for f32, branch-free so loops over it vectorise: range reduction by `ln 2` in two parts
/// and a degree-6 polynomial (Cephes' `expf` coefficients), relative error ≈ 2e-7. Exactly 0 below
/// −87.3 (so `exp(−∞) = 0`, as masked scores need) and `+∞` above 88.7.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to an integer that lands in the low mantissa bits: `n` as a float and
    // as bits without a float→int cast (whose saturating semantics do not vectorise).
    const MAGIC: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.7);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let r2 = r * r;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5e-1;
    let y = p * r2 + r + 1.0;
    let scale = f32::from_bits(t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127) << 23);
    let out = y * scale;
    if x < -87.3 {
        0.0
    } else if x > 88.7 {
        f32::INFINITY
    } else {
        out
    }
}

/// Lanes the helpers below work in: fixed-size chunks compile to whole vector operations (and
/// per-lane partial sums vectorise, where one running float sum cannot be reordered).
const LANES: usize = 8;

/// `Σ a·b` (per-lane partial sums, then the lanes in order).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; LANES];
    let (mut ac, mut bc) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
    for (av, bv) in (&mut ac).zip(&mut bc) {
        for k in 0..LANES {
            acc[k] += av[k] * bv[k];
        }
    }
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `Σ a`.
#[inline(always)]
pub fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut ac = a.chunks_exact(LANES);
    for av in &mut ac {
        for k in 0..LANES {
            acc[k] += av[k];
        }
    }
    acc.iter().sum::<f32>() + ac.remainder().iter().sum::<f32>()
}

/// `max a` (−∞ for an empty slice).
#[inline(always)]
pub fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut ac = a.chunks_exact(LANES);
    for av in &mut ac {
        for k in 0..LANES {
            acc[k] = if av[k] > acc[k] { av[k] } else { acc[k] };
        }
    }
    ac.remainder().iter().chain(&acc).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// `x ← e^(x − shift)` for every element; returns their sum.
#[inline(always)]
pub fn exp_shifted(x: &mut [f32], shift: f32) -> f32 {
    for v in x.iter_mut() {
        *v = exp(*v - shift);
    }
    sum(x)
}

/// `1 / (1 + e^−x)` through [`exp`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_standard_library_to_a_few_ulps() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(100.0), f32::INFINITY);
    }
}
