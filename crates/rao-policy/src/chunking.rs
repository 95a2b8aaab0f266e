//! Batches split so that no tensor of a forward pass outgrows what a GPU buffer may hold.
//!
//! wgpu refuses a buffer above its `max_buffer_size` (256 MiB by default; Mesa's lavapipe, the
//! software Vulkan driver, refuses 297 MB), and a language model's conversations are long: the
//! attention scores `[B, H, T, T]` of eight 1,524-token sequences over 4 heads are 297 MB. On a
//! GPU backend a batch is therefore cut, in order, into runs whose largest tensor stays within
//! [`GPU_TENSOR_BYTES`]; a training step sums the runs' gradients (each run's loss weighted by its
//! share of the tokens, so the step is the whole batch's), inference concatenates their results.
//! The CPU backend takes any size and is never split, so its results keep their bits.

use std::ops::Range;

use crate::model::ModelConfig;

/// The most bytes one tensor may take on a GPU backend: half of wgpu's default buffer limit.
pub const GPU_TENSOR_BYTES: usize = 128 << 20;

/// Bytes of the largest f32 tensor of a forward over `b` rows of `t` positions that computes
/// logits for `n` rows: the attention scores `[B, H, T, T]`, the MLP's `[B·T, d_ff]`, the
/// logits and grammar bias `[N, V]`.
pub fn largest_tensor_bytes(cfg: &ModelConfig, b: usize, t: usize, n: usize) -> usize {
    4 * (b * cfg.n_heads * t * t).max(b * t * cfg.d_ff).max(n * cfg.vocab)
}

/// `items` (each: its positions and its logit rows) cut in order into runs whose batch — padded
/// to the run's longest item — stays within `budget` bytes. An item too large alone is a run of
/// its own (tried as it is: the backend's error then says what did not fit).
pub fn runs_within(cfg: &ModelConfig, items: &[(usize, usize)], budget: usize) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut longest, mut rows) = (0, 0, 0);
    for (i, &(t, n)) in items.iter().enumerate() {
        let (l, r) = (longest.max(t), rows + n);
        if i > start && largest_tensor_bytes(cfg, i + 1 - start, l, r) > budget {
            runs.push(start..i);
            (start, longest, rows) = (i, t, n);
        } else {
            (longest, rows) = (l, r);
        }
    }
    if start < items.len() {
        runs.push(start..items.len());
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        serde_json::from_value(serde_json::json!({"vocab": 416, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 192})).unwrap()
    }

    #[test]
    fn the_failing_lavapipe_batch_is_cut_into_runs_that_fit() {
        // Eight conversations of 1,524 positions, 40 generated tokens each: 297 MB of scores at once.
        let items = vec![(1524, 40); 8];
        assert_eq!(largest_tensor_bytes(&cfg(), 8, 1524, 320), 297_289_728);
        let runs = runs_within(&cfg(), &items, GPU_TENSOR_BYTES);
        assert_eq!(runs, vec![0..3, 3..6, 6..8]);
        for r in &runs {
            assert!(largest_tensor_bytes(&cfg(), r.len(), 1524, 40 * r.len()) <= GPU_TENSOR_BYTES);
        }
    }

    #[test]
    fn small_batches_stay_whole_and_an_oversized_item_stands_alone() {
        assert_eq!(runs_within(&cfg(), &[(96, 10); 64], GPU_TENSOR_BYTES), vec![0..64]);
        assert_eq!(runs_within(&cfg(), &[(10, 1), (9000, 5), (10, 1)], GPU_TENSOR_BYTES), vec![0..1, 1..2, 2..3]);
        assert!(runs_within(&cfg(), &[], GPU_TENSOR_BYTES).is_empty());
    }
}
