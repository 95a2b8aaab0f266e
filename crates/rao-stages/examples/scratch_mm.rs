use std::time::Instant;
use burn::tensor::{Tensor, TensorData};
fn main() {
    rao_policy::tune_allocator();
    let dev = burn::tensor::Device::flex();
    for (m, k, n) in [(4032usize, 64usize, 320usize), (4032, 192, 64), (64, 4032, 64), (512, 512, 512)] {
        let a = Tensor::<2>::from_data(TensorData::new(vec![0.5f32; m * k], [m, k]), &dev);
        let b = Tensor::<2>::from_data(TensorData::new(vec![0.25f32; k * n], [k, n]), &dev);
        let mut reps = 0; let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < 1.0 { let c = a.clone().matmul(b.clone()); let _ = c.into_data(); reps += 1; }
        let g1 = 2.0 * (m * k * n) as f64 * reps as f64 / t0.elapsed().as_secs_f64() / 1e9;
        let mut reps = 0; let t0 = Instant::now();
        let mut acc = a.clone().matmul(b.clone());
        while t0.elapsed().as_secs_f64() < 1.0 { acc = a.clone().matmul(b.clone()); reps += 1; }
        let _ = acc.into_data();
        let g2 = 2.0 * (m * k * n) as f64 * reps as f64 / t0.elapsed().as_secs_f64() / 1e9;
        println!("{m}x{k}x{n}: {g1:.1} GFLOP/s with into_data, {g2:.1} without");
    }
}
