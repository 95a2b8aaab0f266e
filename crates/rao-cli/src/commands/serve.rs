//! `rao serve`: a trained policy behind an OpenAI-compatible API.

use super::*;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
    /// The instance whose inputs to serve, e.g. `evaluate` or `rollout@59`.
    pub instance: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub addr: String,
    /// Requests in flight answered together in one batched sampling pass, at most (1: each by
    /// itself, several at once on the CPU's cores). Default: 1 on the CPU (measured faster
    /// there), 64 on a GPU backend.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_batch: Option<u64>,
    /// Seconds a connection may take to send a request's headers (from opening, or from the
    /// previous reply) before it is closed.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub header_timeout: u64,
    /// Print what a request must hold (the environment's instructions, the message layout and
    /// a ready request) and exit; a running server answers the same at `GET /v1/environment`.
    #[arg(long)]
    pub explain: bool,
}

pub async fn serve(args: ServeArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let ServeArgs { p, instance, addr, max_batch, header_timeout, explain } = args;
    let (c, store) = load_read_only(&p, &registry)?;
    let ctx = rao_pipeline::exec::context_by_name(&c, &store, &instance).await?;
    anyhow::ensure!(
        ctx.inputs.contains_key("tasks") && ctx.inputs.contains_key("checkpoint"),
        "`{instance}` has no `tasks` and `checkpoint` inputs to serve (an `evaluate` or a `rollout` of a checkpoint has)"
    );
    let mut served = rao_stages::serve::Served::from_stage(&ctx).await?;
    if let Some(max_batch) = max_batch {
        served = served.with_max_batch(max_batch as usize);
    }
    if explain {
        print!("{}", served.explain(&format!("http://{addr}/v1")));
        return Ok(ExitCode::SUCCESS);
    }
    let served = std::sync::Arc::new(served);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!(
        "serving `{}` on http://{}/v1 (POST /chat/completions, GET /models; up to {} requests a batch)\n\
         what a request holds: GET /environment, or `rao serve … --explain`",
        served.model,
        listener.local_addr()?,
        served.max_batch()
    );
    rao_stages::serve::serve(listener, served, std::time::Duration::from_secs(header_timeout)).await?;
    Ok(ExitCode::SUCCESS)
}
