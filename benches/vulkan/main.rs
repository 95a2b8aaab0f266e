//! `hf_bench` built with Burn's `vulkan` feature (see Cargo.toml beside this file).

#[path = "../../crates/rao-policy/examples/hf_bench.rs"]
mod hf_bench;

fn main() -> anyhow::Result<()> {
    hf_bench::run("wgpu-spirv")
}
