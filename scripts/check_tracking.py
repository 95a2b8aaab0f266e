#!/usr/bin/env python3
"""Read back what rao exported, with the trackers' own readers, as JSON (read by a Rust test).
  check_tracking.py tensorboard RUN_DIR          TensorBoard's EventAccumulator
  check_tracking.py mlflow URL EXPERIMENT        the MLflow client against a running server
"""
import json
import sys
import tempfile


def tensorboard(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    return {
        "scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
        "texts": {t: acc.Tensors(t)[0].tensor_proto.string_val[0].decode() for t in tags["tensors"]},
    }


def mlflow(url, experiment):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name(experiment)
    runs = []
    for r in client.search_runs([exp.experiment_id]):
        metrics = {k: sorted([m.step, m.value] for m in client.get_metric_history(r.info.run_id, k)) for k in r.data.metrics}
        artifacts = [a.path for a in client.list_artifacts(r.info.run_id)]
        report = None
        if "report.html" in artifacts:
            with tempfile.TemporaryDirectory() as d:
                report = open(client.download_artifacts(r.info.run_id, "report.html", d)).read()
        runs.append({
            "run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status,
            "params": r.data.params, "tags": r.data.tags, "metrics": metrics,
            "artifacts": artifacts, "report": report,
        })
    return {"runs": runs}


kind = sys.argv[1]
print(json.dumps(tensorboard(sys.argv[2]) if kind == "tensorboard" else mlflow(sys.argv[2], sys.argv[3])))
