//! `rao path`: where an instance's artifacts are, for the tools people read them with (DuckDB,
//! pyarrow, a browser) — without copying hashed store paths by hand.

use anyhow::{Context, bail};
use rao_pipeline::plan::{Row, State};
use rao_pipeline::{Compiled, Store};
use rao_store::manifest::{self, Manifest};
use rao_store::store::object_dir;

/// The row of an instance by name (`evaluate`, `rollout@60`, `evaluate[window=64]`); a stage
/// name that expanded into one instance, or a loop body stage (its last finished iteration), is
/// accepted too; a matrix stage or a loop's name is refused with the names to use.
pub fn find_instance<'a>(c: &Compiled, rows: &'a [Row], name: &str) -> anyhow::Result<&'a Row> {
    if let Some(r) = rows.iter().find(|r| r.instance == name) {
        return Ok(r);
    }
    let list = |names: Vec<&str>| {
        let shown: Vec<&str> = names.iter().copied().take(12).collect();
        format!("{}{}", shown.join(", "), if names.len() > 12 { ", …" } else { "" })
    };
    let of_stage: Vec<&Row> = rows.iter().filter(|r| r.stage == name).collect();
    // A matrix fans a stage out into instances of equal standing: which one is for the user to say.
    if of_stage.iter().any(|r| r.instance.contains('[')) {
        bail!(
            "stage `{name}` has {} instances (a matrix); name one: {}",
            of_stage.len(),
            list(of_stage.iter().map(|r| r.instance.as_str()).collect())
        );
    }
    // A stage of a loop body: its last finished iteration (none finished: the last, whose
    // state then says what to run).
    if let Some(last) = of_stage.iter().rev().find(|r| r.state == State::Done).or(of_stage.last()) {
        return Ok(last);
    }
    if let Some(l) = c.loops.iter().find(|l| l.name == name) {
        let stages: Vec<&str> = l.iterations.first().map(|it| it.keys().map(String::as_str).collect()).unwrap_or_default();
        bail!(
            "`{name}` is a loop, not a stage: name one of its stages ({}), e.g. `{}@{}` for an iteration or `{}` for its last finished one",
            stages.join(", "),
            stages.first().unwrap_or(&"STAGE"),
            l.max_iterations,
            stages.first().unwrap_or(&"STAGE")
        );
    }
    let names: Vec<&str> = rows.iter().map(|r| r.instance.as_str()).collect();
    let hint = rao_plan::diag::did_you_mean(name, names.iter().copied()).unwrap_or_else(|| {
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
