//! `rao report`: a run's evaluations as a table and an HTML page.

use super::*;

#[derive(clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
    /// A run id from `runs/PIPELINE/` in the store (`latest`: the last run started). Without
    /// it, the evaluations of the file as given now are read from the store by fingerprint.
    #[arg(long)]
    pub run: Option<String>,
    /// Write the HTML page here (default: `reports/PIPELINE/RUN.html` in the store; `-`: to
    /// stdout, the table then goes to stderr).
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
    /// Also export this run to a tracker: an MLflow server URL or `tensorboard:DIR`.
    #[arg(long, value_name = "URL")]
    pub track: Vec<String>,
}

pub async fn report(args: ReportArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let ReportArgs { p, run, html, track } = args;
    let (c, store) = load_read_only(&p, &registry)?;
    require_contents(&store, &format!("; `{}` makes it", run_command(&p)))?;
    let res = rao_results::RunResults::load(&c, &store, run.as_deref()).await?;
    // A past run (`--run`) is produced again under its own --set values.
    let again = PipelineArgs { set: if run.is_some() { res.overrides.clone() } else { p.set.clone() }, ..p.clone() };
    for (name, why) in res.missing.iter().filter(|(n, _)| c.instances.iter().any(|i| &i.name == n && i.kind == rao_stages::kinds::EVALUATE))
    {
        let given = if run.is_some() { "for that run" } else { "for this pipeline as given" };
        eprintln!("{name}: not in the store {given} ({why}); `{}` produces it", run_command(&again));
    }
    let rows: Vec<_> = res.evaluations.iter().flat_map(|e| e.rows.iter().cloned()).collect();
    let evaluates = c.instances.iter().any(|i| i.kind == rao_stages::kinds::EVALUATE);
    if res.run.is_none() && (if evaluates { rows.is_empty() } else { res.costs.is_empty() }) {
        let what = if evaluates { "evaluation" } else { "result" };
        anyhow::bail!(
            "nothing to report: no run and no {what} of pipeline `{}` with seed {} is in the store; `{}` produces them",
            c.name,
            res.seed,
            run_command(&again)
        );
    }
    // A pipeline without evaluations is reported by its stages: time and outputs.
    let mut table = if evaluates { rao_results::text::eval_table(&rows) } else { rao_results::text::stage_table(&res.costs) };
    table += &match &res.run {
        Some(r) => format!(
            "pipeline {} · seed {} · run {} ({}) · {}{}\n",
            c.name,
            res.seed,
            r.run_id,
            r.status,
            rao_results::html::utc(r.started_at),
            // `--run`: a run of another file with the same pipeline name (or of this one
            // before it moved) says which.
            if same_file(std::path::Path::new(&res.file), &c.file) { String::new() } else { format!(" · of {}", res.file) }
        ),
        None => format!("pipeline {} · seed {} · no run record names these results\n", c.name, res.seed),
    };
    // `--html -`: the page on stdout (for a pipe), the table beside it on stderr.
    if html.as_deref() == Some(std::path::Path::new("-")) {
        eprint!("{table}");
        print!("{}", rao_results::html::page(&res));
    } else {
        print!("{table}");
        match write_report(&store, &res, html.as_deref()).await {
            Ok(at) => println!("report: {at}"),
            // The table is out; a store this user may only read has no room for the page.
            Err(e) if html.is_none() => {
                eprintln!("warning: the HTML report was not written into the store ({e:#}); `--html FILE` writes it elsewhere")
            }
            Err(e) => return Err(e),
        }
    }
    if let (false, Some(r)) = (track.is_empty(), &res.run) {
        let targets = track
            .iter()
            .map(|t| rao_results::tracking::Target::parse(t, std::path::Path::new(".")).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<Vec<_>>>()?;
        export_run(&c, &store, &r.run_id, &targets).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Write the HTML page of `res`; returns where it is (a local path, or a URL in the store).
async fn write_report(store: &Store, res: &rao_results::RunResults, to: Option<&std::path::Path>) -> anyhow::Result<String> {
    let page = rao_results::html::page(res);
    if let Some(path) = to {
        std::fs::write(path, &page).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        return Ok(path.display().to_string());
    }
    let name = match (&res.run, res.evaluations.first()) {
        (Some(r), _) => r.run_id.clone(),
        (None, Some(e)) => format!("eval-{}", &e.fingerprint[..12.min(e.fingerprint.len())]),
        (None, None) => "stages".into(),
    };
    let key = format!("reports/{}/{name}.html", res.pipeline);
    store.put(&key, bytes::Bytes::from(page)).await?;
    Ok(match store.local_path(&key) {
        Some(p) => p.display().to_string(),
        None => format!("{}/{key}", store.url().trim_end_matches('/')),
    })
}
