//! What makes this crate's float results depend on the machine: part of the fingerprint of every
//! stage that runs the policy, so stores shared by different machines never mix their bits.
//!
//! On the CPU backend: the SIMD path the fused kernels and gemm pick at run time (AVX-512,
//! AVX2+FMA or baseline on x86-64), the data cache sizes (gemm sizes its blocks from them, which
//! sets the order of its sums) and whether the fused kernels are on (`RAO_FUSED_KERNELS=0` turns
//! them off). Not the thread count: a warm start gave the same checkpoint bytes with 1, 2 and 3
//! threads (gemm splits rows and columns across threads, never a sum). On wgpu: the backend name
//! only — the adapter is not known until a device is opened (a known gap: two GPUs would share
//! results).

use crate::policy::Backend;

/// `cpu/x86_64-avx512/L1d 48K L2 2048K L3 …/fused`, or `wgpu`.
pub fn machine_profile(backend: Backend) -> String {
    match backend {
        Backend::Wgpu => "wgpu".into(),
        Backend::Cpu => {
            let fused = if crate::kernels::enabled() { "fused" } else { "decomposed" };
            format!("cpu/{}/{}/{fused}", simd_path(), cache_sizes())
        }
    }
}

fn simd_path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::kernels::simd::has_avx512() {
            "x86_64-avx512"
        } else if crate::kernels::simd::has_avx2() {
            "x86_64-avx2"
        } else {
            "x86_64-baseline"
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH
    }
}

/// Data and unified cache sizes as the kernel reports them (empty where it does not).
fn cache_sizes() -> String {
    let mut out = Vec::new();
    for index in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).map(|s| s.trim().to_string());
        let (Ok(level), Ok(kind), Ok(size)) = (read("level"), read("type"), read("size")) else { break };
        if kind != "Instruction" {
            out.push(format!("L{level}{} {size}", if kind == "Data" { "d" } else { "" }));
        }
    }
    if out.is_empty() { "caches unknown".into() } else { out.join(" ") }
}
