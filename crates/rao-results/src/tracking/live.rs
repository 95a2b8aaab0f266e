//! Trackers fed while a run goes: each point a stage records (the warm start's loss and gate
//! checks) as it is recorded, and each loop iteration's metrics as its instance finishes. The
//! export at the run's end completes the same run: TensorBoard's event file is written again
//! whole, MLflow's run gets what it lacks and is closed. A tracker that fails is warned about
//! once and dropped until that export.

use std::time::{SystemTime, UNIX_EPOCH};

use rao_pipeline::Store;
use rao_pipeline::events::Event;
use rao_store::manifest;
use tokio::sync::mpsc;

use crate::results::{iteration_of, series_of};
use crate::tracking::{Scalar, Target, key, mlflow, tensorboard};

enum Message {
    Event(Event),
    Stop,
}

/// The live trackers of one run; feed it the run's events with [`Live::observer`].
pub struct Live {
    tx: mpsc::UnboundedSender<Message>,
    task: tokio::task::JoinHandle<()>,
}

enum Sink {
    TensorBoard(tensorboard::LiveFile),
    MlFlow(mlflow::LiveRun),
}

impl Sink {
    async fn open(target: &Target, pipeline: &str, run_id: &str, started_at: f64) -> anyhow::Result<Sink> {
        Ok(match target {
            Target::TensorBoard(dir) => Sink::TensorBoard(tensorboard::LiveFile::create(&dir.join(pipeline).join(run_id), started_at)?),
            Target::MlFlow { url, experiment } => {
                let experiment = experiment.as_deref().unwrap_or(pipeline);
                Sink::MlFlow(mlflow::LiveRun::start(url, experiment, pipeline, run_id, started_at).await?)
            }
        })
    }

    async fn write(&mut self, scalars: &[Scalar]) -> anyhow::Result<()> {
        match self {
            Sink::TensorBoard(file) => file.write(scalars),
            Sink::MlFlow(run) => run.log(scalars).await,
        }
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Live {
    /// Start the trackers' task; it opens each target when the run announces itself.
    pub fn start(targets: Vec<Target>, store: Store) -> Live {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut sinks: Vec<(String, Sink)> = Vec::new();
            while let Some(Message::Event(e)) = rx.recv().await {
                let scalars = match e {
                    Event::RunStarted { pipeline, run_id, .. } => {
                        for t in &targets {
                            match Sink::open(t, &pipeline, &run_id, now()).await {
                                Ok(sink) => sinks.push((t.describe(), sink)),
                                Err(e) => {
                                    eprintln!("warning: live tracking to {} failed ({e:#}); it gets the run when it ends", t.describe())
                                }
                            }
                        }
                        continue;
                    }
                    Event::Metric { instance, metric, step, value } => {
                        vec![Scalar { key: key(&[&instance, &metric]), step: step as i64, value, time: now() }]
                    }
                    Event::Finished { instance, fingerprint, .. } => match iteration_of(&instance) {
                        Some(k) => iteration_scalars(&store, &instance, &fingerprint, k).await,
                        None => continue,
                    },
                    _ => continue,
                };
                let mut failed = Vec::new();
                for (i, (name, sink)) in sinks.iter_mut().enumerate() {
                    if let Err(e) = sink.write(&scalars).await {
                        eprintln!("warning: live tracking to {name} failed ({e:#}); it gets the run when it ends");
                        failed.push(i);
                    }
                }
                for i in failed.into_iter().rev() {
                    sinks.remove(i);
                }
            }
        });
        Live { tx, task }
    }

    /// What the run's reporter calls on each event.
    pub fn observer(&self) -> impl Fn(&Event) + Send + Sync + 'static {
        let tx = self.tx.clone();
        move |e: &Event| {
            if matches!(e, Event::RunStarted { .. } | Event::Metric { .. } | Event::Finished { .. }) {
                let _ = tx.send(Message::Event(e.clone()));
            }
        }
    }

    /// Write out what is queued, then stop (before the run's final export).
    pub async fn finish(self) {
        let _ = self.tx.send(Message::Stop);
        let _ = self.task.await;
    }
}

/// A finished loop instance's metrics at its iteration (none if its manifest cannot be read).
async fn iteration_scalars(store: &Store, instance: &str, fingerprint: &str, k: u32) -> Vec<Scalar> {
    let Ok(state) = manifest::read(store, fingerprint).await else { return Vec::new() };
    let Some(m) = state.done() else { return Vec::new() };
    let series = series_of(instance);
    m.metrics
        .iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(metric, &value)| Scalar { key: key(&[&series, metric]), step: k as i64, value, time: m.finished_at })
        .collect()
}
