//! GFLOP/s of gemm 0.19 on the update step's matrix shapes, 2 threads and 1, each for ≥ 1 s.

use std::time::Instant;

fn gflops(m: usize, k: usize, n: usize, threads: usize) -> f64 {
    let (a, b, mut c) = (vec![0.5f32; m * k], vec![0.25f32; k * n], vec![0.0f32; m * n]);
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let (mut reps, t0) = (0usize, Instant::now());
    while t0.elapsed().as_secs_f64() < 1.0 {
        // SAFETY: the pointers and strides describe the three row-major buffers above.
        unsafe {
            gemm::gemm(m, n, k, c.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), 1, k as isize, b.as_ptr(), 1, n as isize, 0.0, 1.0, false, false, false, par);
        }
        reps += 1;
    }
    2.0 * (m * k * n) as f64 * reps as f64 / t0.elapsed().as_secs_f64() / 1e9
}

fn main() {
    for (m, k, n) in [(4032, 64, 320), (4032, 192, 64), (64, 4032, 64), (512, 512, 512)] {
        println!("{m}x{k}x{n}: {:.1} GFLOP/s (2 threads) {:.1} (1 thread)", gflops(m, k, n, 2), gflops(m, k, n, 1));
    }
}
