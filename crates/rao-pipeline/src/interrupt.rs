//! What stops a run: Ctrl-C, and — because each shell stage runs in a process group of its own,
//! out of reach of the terminal's signals — the terminal closing (SIGHUP) and `kill` (SIGTERM) too. Each
//! is handled as Ctrl-C is: running stages are cancelled (their process groups killed) and the
//! run is recorded as cancelled.

/// Resolves at the first SIGINT, SIGTERM or SIGHUP (Ctrl-C alone where there are no such signals).
pub async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()];
        let mut streams: Vec<_> = kinds.into_iter().filter_map(|k| signal(k).ok()).collect();
        if !streams.is_empty() {
            let waits = streams.iter_mut().map(|s| Box::pin(s.recv()));
            futures::future::select_all(waits).await;
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
