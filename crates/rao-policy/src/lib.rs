//! The Burn policy: a small decoder-only transformer over the environments' tokenizer,
//! batched constrained sampling with a KV cache, RL losses, AdamW with global clipping,
//! and deterministic checkpoints; Hugging Face Llama/Qwen checkpoints as policies (`hf`). The only
//! crate that depends on Burn.

pub mod chunking;
pub mod hf;
pub mod kernels;
pub mod lora;
mod machine;
pub mod model;
pub mod params;
pub mod policy;
pub mod prefix_cache;

pub use machine::machine_profile;
pub use model::{ModelConfig, Transformer};
pub use policy::{Backend, Checkpoint, Loss, Policy, SampleRequest, Sequence, StepMetrics};

/// Keep freed tensor buffers in the process. The CPU backend allocates a fresh buffer for every
/// op; glibc hands blocks above its mmap threshold back to the OS on free, so each training step
/// paid for mmap/munmap and a page fault per 4 KiB touched (BENCHMARKS.md, "Where settings
/// come from"). The
/// threshold stops at 32 MiB, and a thread's own arena maps larger blocks whatever the settings
/// (the text warm start's attention probabilities are ~100 MiB: 46 k page faults a step), so
/// every thread allocates from the main heap, which grows and is never mapped per block.
/// Call once at program start, before other threads allocate (process-wide settings).
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before other threads allocate much.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}
