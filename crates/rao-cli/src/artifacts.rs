//! `rao path`: where an instance's artifacts are, for the tools people read them with (DuckDB,
//! pyarrow, a browser) — without copying hashed store paths by hand.

use anyhow::{Context, bail};
use rao_pipeline::Store;
use rao_pipeline::manifest::{self, Manifest};
use rao_pipeline::plan::{Row, State};
use rao_pipeline::store::object_dir;

/// The row of an instance by name (`evaluate`, `rollout@60`, `evaluate[window=64]`); a stage
/// name that expanded into one instance (a loop body stage: its last iteration) is accepted too.
pub fn find_instance<'a>(rows: &'a [Row], name: &str) -> anyhow::Result<&'a Row> {
    if let Some(r) = rows.iter().find(|r| r.instance == name) {
        return Ok(r);
    }
    let of_stage: Vec<&Row> = rows.iter().filter(|r| r.stage == name && r.state == State::Done).collect();
    if let Some(last) = of_stage.last() {
        return Ok(last);
    }
    let names: Vec<&str> = rows.iter().map(|r| r.instance.as_str()).collect();
    let hint = rao_pipeline::diag::did_you_mean(name, names.iter().copied()).unwrap_or_else(|| {
        let shown: Vec<&str> = names.iter().copied().take(12).collect();
        format!("instances: {}{}", shown.join(", "), if names.len() > 12 { ", …" } else { "" })
    });
    bail!("no stage instance `{name}` in this pipeline; {hint}")
}

/// The manifest of a finished instance, or an error that says how to produce it (`run`: the
/// `rao run` command for the pipeline as given; what is cached stays so).
pub async fn finished(store: &Store, row: &Row, run: &str) -> anyhow::Result<Manifest> {
    let fp = match (&row.state, &row.fingerprint) {
        (State::Done, Some(fp)) => fp,
        (state, _) => bail!(
            "`{}` is {} in {} for this pipeline as given; `{run}` produces it{}",
            row.instance,
            format!("{state:?}").to_lowercase(),
            store.url(),
            if row.reasons.is_empty() { String::new() } else { format!(" ({})", row.reasons.join("; ")) }
        ),
    };
    manifest::read(store, fp).await?.done().with_context(|| format!("`{}` has no usable manifest", row.instance))
}

/// The local path (or store URL) of an instance's file, output directory or object directory.
/// `file` is `OUTPUT/PATH` or a bare file name looked up in every output.
pub fn locate(store: &Store, m: &Manifest, file: Option<&str>) -> anyhow::Result<String> {
    let key = key(m, file)?;
    Ok(match store.local_path(&key) {
        Some(p) => p.display().to_string(),
        None => format!("{}/{key}", store.url().trim_end_matches('/')),
    })
}

/// The store key of what [`locate`] finds.
pub fn key(m: &Manifest, file: Option<&str>) -> anyhow::Result<String> {
    Ok(match file {
        None if m.outputs.len() == 1 => m.output_prefix(m.outputs.keys().next().expect("one output")),
        None => object_dir(&m.fingerprint),
        Some(f) => {
            let hits: Vec<String> = m
                .outputs
                .iter()
                .flat_map(|(out, files)| files.iter().map(move |e| (out, e)))
                .filter(|(out, e)| {
                    let file_name = e.path.rsplit('/').next();
                    e.path == f || format!("{out}/{}", e.path) == f || (!f.contains('/') && file_name == Some(f))
                })
                .map(|(out, e)| m.file_key(out, &e.path))
                .collect();
            match hits.as_slice() {
                [one] => one.clone(),
                [] => {
                    let all: Vec<String> =
                        m.outputs.iter().flat_map(|(out, files)| files.iter().map(move |e| format!("{out}/{}", e.path))).collect();
                    bail!("`{}` has no file `{f}`; its files: {}", m.instance, all.join(", "))
                }
                many => bail!("`{f}` names several files of `{}`: {}; write OUTPUT/FILE", m.instance, many.join(", ")),
            }
        }
    })
}
