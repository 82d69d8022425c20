"""``study plan --against TRAIN_DIR``: the plan's prediction held against a measured
``study train``.

For every measured point of the train run (p, allreduce, weak or strong scaling, batch per
rank) the plan predicts the step from three inputs, none of them taken from that point:

- **compute**: the measured step at p = 1 of the same algorithm in the same ``train.json``
  (the whole step: reading the batch, forward, backward, the update), scaled in proportion
  to the batch per rank (strong scaling: B / p against B at p = 1; weak scaling: 1), and by
  ``max(1, p / cores)`` where more ranks run than the machine that ran them has cores (the
  ranks take turns on the cores). Of that step, the measured share of compute is forward and
  backward, a third and two thirds, as in the plan;
- **the gradients**: the layers of the model the run trained (``hpctrain.models`` built on
  the meta device, with the run's ``hidden``, ``model_mb`` and the data's sample shape and
  classes), cut into the run's ``bucket_mb`` buckets in backward order;
- **the network**: the ``params.json`` of ``study allreduce`` fitted on the same cluster
  (α', β' between nodes where the fit has them), ranks placed ``ranks_per_node`` to a node.

The step is the predicted compute plus the exposed communication of the plan's own schedule
(:func:`.step.predict`, policy ``hpctrain``); samples/s = p · batch per rank / step, the
measured figure's own definition (every rank's samples, padding included, over the
slowest rank's time). A point is within the line when |predicted / measured - 1| <= 15 %.
"""

import json
import os

from ..collectives import cost
from ..data import HDF5Dataset
from ..data.atomic import write_json, write_text
from ..errors import UsageError
from ..train.config import load_config
from . import plan, planner, step

#: The largest relative error of samples/s that counts as a good prediction.
LINE = 0.15


def train_document(train_dir):
    """The ``train.json`` of a ``study train`` report folder."""
    path = os.path.join(train_dir, "train.json")
    try:
        with open(path) as f:
            document = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--against {train_dir}: no train.json there; give the --out folder "
                         f"of a `study train` run") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--against {train_dir}: train.json is unreadable ({exc}); give "
                         f"the --out folder of a `study train` run") from None
    if not isinstance(document, dict) or "rows" not in document or "settings" not in document:
        raise UsageError(f"--against {train_dir}: train.json has no rows and settings; it "
                         f"is not a `study train` report")
    return document


def train_config(settings):
    """The ``TrainConfig`` the run's jobs used: its model and batch, and every ``--set``."""
    pairs = [("model", settings["model"])]
    pairs += [tuple(item.split("=", 1)) for item in settings.get("set") or []]
    return load_config(None, [(key.strip().lstrip("-"), value) for key, value in pairs])


def train_layers(config):
    """The layers of the model ``config`` trains, for its data's samples and classes."""
    if config.dataset:
        raise UsageError(f"the train run read --dataset {config.dataset}: give a run on an "
                         f"HDF5 --data file, whose sample shape and classes can be read")
    with HDF5Dataset(config.data, config.x, config.y) as data:
        shape, classes = data.sample_shape, data.num_classes
    layers, _ = planner.model_layers(config.model, shape, classes=classes, hidden=config.hidden,
                                  model_mb=config.model_mb)
    return layers


def predict_point(row, base, layers, cluster, cores, bucket_mb, overlap=True):
    """The predicted step of the measured ``row`` from the p = 1 row ``base``: a dict of
    compute, exposed, step (s) and samples/s; see the module's text."""
    p, batch = row["np"], row["batch_per_rank"]
    scale = batch / base["batch_per_rank"] * max(1.0, p / cores)
    step1 = base["step_s"]
    compute1 = min(step1, base["compute_s"] * base["measured_epochs"] / base["steps"])
    forward_s, backward_s = scale * compute1 / 3, scale * 2 * compute1 / 3
    grads = step.gradients(layers, backward_s)
    if not overlap:
        # Without the communication thread every bucket waits for the end of backward.
        grads = [step.Gradient(g.name, g.nbytes, backward_s) for g in grads]
    point = step.predict(grads, forward_s, backward_s, p, cluster, row["algo"], "hpctrain",
                         bucket_mb)
    step_s = scale * step1 + point["exposed_s"]
    return {"compute_s": scale * step1, "exposed_s": point["exposed_s"], "step_s": step_s,
            "comm_s": point["comm_s"], "transfers": point["transfers"],
            "nodes": point["nodes"], "samples_per_s": p * batch / step_s}


def compare(document, layers, cluster, bucket_mb, overlap=True, source=""):
    """One row per measured point of a modelled algorithm: predicted against measured."""
    rows, cores = document["rows"], document["cores"]
    scaling = document["settings"]["scaling"]
    out = []
    for row in rows:
        if row["algo"] not in cost.modelled() or row["np"] == 1:
            continue
        base = next((r for r in rows if r["algo"] == row["algo"] and r["np"] == 1), None)
        if base is None:
            raise UsageError(f"--against {source}: no p = 1 point of {row['algo']}; its "
                             f"compute comes from there: run `study train` with p = 1 "
                             f"(it adds it unless the run was cut short)")
        predicted = predict_point(row, base, layers, cluster, cores, bucket_mb, overlap)
        measured_steps = row["steps"] / row["measured_epochs"]
        error = predicted["samples_per_s"] / row["samples_per_s"] - 1
        out.append({"source": source, "scaling": scaling, "np": row["np"],
                    "algo": row["algo"], "batch_per_rank": row["batch_per_rank"],
                    "oversubscribed": row["oversubscribed"], "nodes": predicted["nodes"],
                    "predicted": predicted["samples_per_s"],
                    "measured": row["samples_per_s"], "error": error,
                    "within": abs(error) <= LINE,
                    "predicted_step_s": predicted["step_s"], "measured_step_s": row["step_s"],
                    "predicted_compute_s": predicted["compute_s"],
                    "predicted_exposed_s": predicted["exposed_s"],
                    "measured_exposed_s": row["exposed_comm_s"] / measured_steps,
                    "comm_s": predicted["comm_s"], "transfers": predicted["transfers"]})
    return out


def run(args):
    """``study plan --against``: the table on stdout, against.md and against.json in --out."""
    if not args.params:
        raise UsageError("--against needs --params PARAMS_JSON: the params.json of `study "
                         "allreduce` fitted on the cluster the train run used")
    profile = plan.read_profile(args.params)
    if args.ranks_per_node is None:
        args.ranks_per_node = profile.get("ranks_per_node") or 0
        if args.ranks_per_node < 1:
            raise UsageError(f"--params {args.params} was fitted on one node: give "
                             f"--ranks-per-node S, the ranks per host of the train run")
    cluster = plan.cluster_of(args)("point")
    rows, inputs = [], []
    for train_dir in [d for item in args.against for d in item.split(",") if d]:
        document = train_document(train_dir)
        config = train_config(document["settings"])
        if args.model and args.model != config.model:
            raise UsageError(f"--against {train_dir} trained --model {config.model}, not "
                             f"{args.model}: give --model {config.model} or drop --model")
        layers = train_layers(config)
        rows += compare(document, layers, cluster, config.bucket_mb, config.overlap,
                        train_dir)
        inputs.append({"train_dir": train_dir, "model": config.model,
                       "scaling": document["settings"]["scaling"],
                       "gradient_bytes": sum(layer.nbytes for layer in layers),
                       "layers": len(layers), "bucket_mb": config.bucket_mb,
                       "overlap": config.overlap, "cores": document["cores"]})
    if not rows:
        raise UsageError(f"--against: no point with p > 1 of a modelled algorithm "
                         f"({', '.join(cost.modelled())})")
    text = summary(rows, inputs, cluster, args.params)
    os.makedirs(args.out, exist_ok=True)
    write_text(os.path.join(args.out, "against.md"), text)
    write_json(os.path.join(args.out, "against.json"),
               {"params": cluster.params.as_dict(), "cluster": cluster.description,
                "line": LINE, "inputs": inputs, "rows": rows})
    print(text)
    return 0


def summary(rows, inputs, cluster, params_path):
    """The markdown: inputs, one row per point, the count within the line."""
    lines = ["# The plan against measured training", "",
             f"- cluster: {cluster.description}"]
    lines += [f"- {i['train_dir']}: {i['scaling']} scaling, model {i['model']} "
              f"({i['gradient_bytes'] / 2**20:.2f} MB of gradients in {i['layers']} layers), "
              f"buckets of {i['bucket_mb']:g} MB, overlap {'on' if i['overlap'] else 'off'}, "
              f"{i['cores']} cores" for i in inputs]
    lines += ["- predicted step = step at p = 1 × batch per rank / batch at p = 1 × "
              "max(1, p / cores) + the schedule's exposed communication; `*`: more ranks "
              "than cores", "",
              "| scaling | p | algorithm | batch per rank | nodes | predicted samples/s | "
              "measured samples/s | error | step ms predicted | measured | exposed ms "
              "predicted | measured | verdict |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        star = "*" if r["oversubscribed"] else ""
        verdict = "within 15 %" if r["within"] else "MISSES 15 %"
        lines.append(f"| {r['scaling']} | {r['np']}{star} | {r['algo']} | "
                     f"{r['batch_per_rank']} | {r['nodes']} | {r['predicted']:.0f} | "
                     f"{r['measured']:.0f} | {100 * r['error']:+.1f} % | "
                     f"{1000 * r['predicted_step_s']:.1f} | {1000 * r['measured_step_s']:.1f} | "
                     f"{1000 * r['predicted_exposed_s']:.1f} | "
                     f"{1000 * r['measured_exposed_s']:.1f} | {verdict} |")
    good = sum(r["within"] for r in rows)
    lines += ["", f"{good} of {len(rows)} points within {LINE:.0%} ({params_path})."]
    missed = [f"{r['scaling']} p = {r['np']} {r['algo']} ({100 * r['error']:+.1f} %)"
              for r in rows if not r["within"]]
    if missed:
        lines.append("Missed: " + ", ".join(missed) + ".")
    return "\n".join(lines) + "\n"
