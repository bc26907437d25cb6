"""edgebnn search on the synthetic CNN: reproducible trials, resume after an interruption, failed trials kept,
budget selection, and one-line errors for bad input (nothing written to the study file before inputs check)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import numpy as np
import pytest
from click.testing import CliRunner
from synthetic import synthetic_cnn

from edgebnn import ir
from edgebnn.cli import main
from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.runtime.reference import Reference
from edgebnn.search import (
    LocalExecutor,
    SearchSettings,
    SearchSpace,
    export_best,
    parse_budget,
    parse_objectives,
    run_search,
)
from edgebnn.search.executors import largest_first
from edgebnn.search.objectives import choose_best
from edgebnn.search.space import TrialConfig, bits_for, modes_for
from edgebnn.search.trial import TrialJob, open_inputs, run_trial, warm_up

optuna = pytest.importorskip("optuna")

# Small enough for a few seconds a search: fixed-point and MCQ export in every mode but shared; binary takes
# only 1 bit, so its trials are drawn without bits (auto).
SPACE = SearchSpace(schemes=("fixed", "mcq", "binary"), bits=("auto", "4"), samples=(2, 4), hoist=("off", "auto"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    bnn = synthetic_cnn()
    model = ir.save(bnn, root / "cnn.ebnn")
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (48, 1, 6, 6)).astype(np.float32)
    # Labels the float BNN predicts (its posterior-predictive argmax): a task it solves, that lowering can hurt.
    y = Reference(bnn).logits(x, 32, seed=1).mean(axis=0).argmax(axis=-1)
    np.savez(root / "val.npz", x=x, y=y)
    np.savez(root / "ood.npz", x=(3 * x[:24]).astype(np.float32))
    return root, model


def settings(files, **kw):
    root, model = files
    base = {"model": str(model), "data": str(root / "val.npz"), "trials": 6, "population": 3, "space": SPACE,
            "runs": 2, "warmup": 0, "seed": 7}
    return SearchSettings(**{**base, **kw})


def strip_timing(report):
    """Trials without what the clock measured (latency, energy and the runner that timed them)."""
    return [{k: v for k, v in t.items() if k not in ("latency_ms", "energy_mj", "energy_reason", "runner")}
            for t in report["trials"]]


@pytest.fixture(scope="module")
def reference(files, tmp_path_factory):
    """One uninterrupted 6-trial search (seed 7)."""
    return run_search(settings(files), tmp_path_factory.mktemp("ref") / "study.jsonl", LocalExecutor(1))


def test_report_holds_every_trial_the_front_and_the_best(reference):
    trials = reference["trials"]
    assert [t["number"] for t in trials] == list(range(6))
    done = [t for t in trials if t["state"] == "complete"]
    assert done, "no trial completed"
    for t in done:
        assert set(t["config"]) == {"scheme", "bits", "sigma_bits", "samples", "mode", "weights", "hoist"}
        assert {"accuracy", "nll", "ece", "brier"} <= set(t["metrics"])
        assert t["bytes"] > 0 and t["artifact_bytes"] > 0 and t["latency_ms"] > 0
        assert t["energy_mj"] is None and t["energy_reason"]  # no power sensor on this machine
    numbers = {t["number"] for t in reference["pareto"]}
    # The front is non-dominated on (bytes, nll, ece), all minimized, and holds the smallest trial.
    objective = {t["number"]: (t["bytes"], t["metrics"]["nll"], t["metrics"]["ece"]) for t in done}
    for n in numbers:
        assert not any(all(a <= b for a, b in zip(objective[m], objective[n], strict=True))
                       and objective[m] != objective[n] for m in objective)
    assert min(objective, key=lambda n: objective[n]) in numbers
    # No budget: best is the smallest completed trial.
    assert reference["best"]["bytes"] == min(t["bytes"] for t in done)


def test_same_seed_same_trials_and_metrics(files, reference, tmp_path):
    again = run_search(settings(files), tmp_path / "study.jsonl", LocalExecutor(1))
    assert strip_timing(again) == strip_timing(reference)
    other = run_search(settings(files, seed=8), tmp_path / "other.jsonl", LocalExecutor(1))
    assert [t["config"] for t in other["trials"]] != [t["config"] for t in reference["trials"]]


def test_a_trial_that_fails_is_a_result_with_its_error(files):
    root, model = files
    config = TrialConfig("ternary", "4", 2, 2, "baked", "fp32", "off")  # ternary takes only 2 bits
    result = run_trial(TrialJob(0, config, str(model), str(root / "val.npz"), None, 0, "cpu", runs=1, warmup=0))
    assert result["state"] == "failed" and result["metrics"] is None and result["latency_ms"] is None
    assert result["error"] == "InvalidOptionError: config: bits=4: must be an integer in 2..2"
    assert result["config"] == config.to_dict()


def test_a_shared_mode_trial_lowers_the_codebook_with_shared_draws(tmp_path):
    """The shared mode exports shared codebook draws: a trial that lowered with independent ones could not export."""
    from edgebnn.ir.mlp import gaussian_mlp

    rng = np.random.default_rng(0)
    layers = [(rng.normal(0, 0.3, (32, 64)).astype(np.float32), np.full((32, 64), 0.05, np.float32), None, None),
              (rng.normal(0, 0.3, (10, 32)).astype(np.float32), np.full((10, 32), 0.05, np.float32), None, None)]
    model = ir.save(gaussian_mlp(layers), tmp_path / "mlp.ebnn")
    np.savez(tmp_path / "val.npz", x=rng.normal(0, 1, (32, 64)).astype(np.float32), y=rng.integers(0, 10, 32))
    config = TrialConfig("codebook", "auto", 2, 4, "shared", "fp32", "off")
    assert config.options == {"sigma_bits": 2, "sampling": "shared"}
    result = run_trial(TrialJob(0, config, str(model), str(tmp_path / "val.npz"), None, 0, "cpu", runs=1, warmup=0))
    assert result["error"] is None and result["state"] == "complete"


def test_binary_and_ternary_trials_take_only_their_width(reference):
    for t in reference["trials"]:
        if t["config"]["scheme"] == "binary":
            assert t["config"]["bits"] == "auto"
    assert all(t["state"] == "complete" for t in reference["trials"])
    assert bits_for("ternary", ("auto", "2", "3")) == ("auto", "2")
    assert bits_for("fixed", ("auto", "1", "3")) == ("auto", "3")
    with pytest.raises(InvalidOptionError, match="scheme binary takes none of the bits 3, 4"):
        SearchSpace(schemes=("binary",), bits=("3", "4"))


def test_resume_after_a_stop_between_batches(files, reference, tmp_path):
    study = tmp_path / "study.jsonl"
    first = run_search(settings(files, trials=3), study, LocalExecutor(1))  # stops after the first batch
    assert len(first["trials"]) == 3
    resumed = run_search(settings(files), study, LocalExecutor(1))
    assert strip_timing(resumed) == strip_timing(reference)


def test_resume_after_an_interrupt_inside_a_batch(files, reference, tmp_path):
    """Ctrl-C after the first trial of the second batch was told: the rest stay 'running' and run again."""
    study = tmp_path / "study.jsonl"

    def interrupt(done, _total, _result):
        if done == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_search(settings(files), study, LocalExecutor(1), progress=interrupt)
    lines = study.read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every journal line complete
    resumed = run_search(settings(files), study, LocalExecutor(1))
    assert strip_timing(resumed) == strip_timing(reference)


def test_two_local_workers_give_the_same_trials(files, reference, tmp_path):
    parallel = run_search(settings(files), tmp_path / "study.jsonl", LocalExecutor(2))
    assert strip_timing(parallel) == strip_timing(reference)


def test_inputs_are_opened_once_per_process_until_a_file_changes(files, tmp_path):
    root, model = files
    data = tmp_path / "val.npz"
    data.write_bytes((root / "val.npz").read_bytes())
    first = open_inputs(str(model), str(data), None)
    assert open_inputs(str(model), str(data), None) is first  # the trials of a search share one IR and data set
    with np.load(data) as z:
        x, y = z["x"], z["y"]
    np.savez(data, x=x[:24], y=y[:24])  # rewritten: a later search on the same path sees the new rows
    again = open_inputs(str(model), str(data), None)
    assert again is not first and again[1].n == 24 and first[1].n == 48
    warm_up(str(model), str(tmp_path / "missing.npz"), None)  # an error is left to the trials to record


def test_batches_are_submitted_largest_ensemble_first():
    config = TrialConfig("fixed", "auto", 2, 4, "baked", "fp32", "off")
    jobs = [TrialJob(n, dataclasses.replace(config, samples=s), "m.ebnn", "digits", None, 0, "cpu")
            for n, s in enumerate((4, 32, 8, 32, 16))]
    assert largest_first(jobs) == [1, 3, 4, 2, 0]  # ties keep trial order


def test_budget_keeps_the_smallest_within_or_names_the_closest():
    def trial(number, size, nll, ece=0.02):
        return {"number": number, "state": "complete", "bytes": size, "metrics": {"nll": nll, "ece": ece},
                "config": {"scheme": "fixed"}}

    trials = [trial(0, 100, 0.30), trial(1, 50, 0.40), {"number": 2, "state": "failed", "error": "x"},
              trial(3, 20, 0.90, ece=0.5)]
    base = {"nll": 0.30, "ece": 0.02}
    assert choose_best(trials, base, {})[0]["number"] == 3  # no budget: the smallest
    assert choose_best(trials, base, {"nll": 0.15})[0]["number"] == 1  # 0 and 1 within; 1 is smaller
    assert choose_best(trials, base, {"nll": 0.05, "ece": 0.0})[0]["number"] == 0
    # None within nll +0.01 of 0.25: trial 0 exceeds its bound least (by 0.04).
    best, reason, closest = choose_best(trials, {"nll": 0.25, "ece": 0.02}, {"nll": 0.01})
    assert best is None and closest["number"] == 0
    assert reason == ("no trial of 3 within the budget; closest: trial 0 (fixed, 100 bytes): nll +0.0500 "
                      "(allowed +0.01)")
    assert choose_best([trials[2]], base, {})[:2] == (None, "no trial completed")


def test_ood_data_adds_auroc(files, tmp_path):
    root, _ = files
    report = run_search(settings(files, trials=2, ood_data=str(root / "ood.npz"),
                                 objectives=("bytes", "auroc")), tmp_path / "study.jsonl", LocalExecutor(1))
    for t in report["trials"]:
        if t["state"] == "complete":
            assert 0.0 <= t["metrics"]["auroc"] <= 1.0
    assert 0.0 <= report["baseline"]["metrics"]["auroc"] <= 1.0


def test_a_device_without_its_runtime_records_one_line_per_trial(files, tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is installed here: the rtx profile would run")
    fixed = SearchSpace(schemes=("fixed",), bits=("auto",), samples=(2,), modes=("baked",), hoist=("off",))
    report = run_search(settings(files, trials=2, device="rtx", space=fixed), tmp_path / "study.jsonl",
                        LocalExecutor(1))
    assert [t["state"] for t in report["trials"]] == ["complete", "complete"], report["trials"]
    for t in report["trials"]:
        assert t["latency_ms"] is None and "\n" not in t["profile_error"] and "tensorrt" in t["profile_error"].lower()
    # With latency as an objective, such a trial cannot be ranked: it fails, with the same error.
    timed = run_search(settings(files, trials=2, device="rtx", objectives=("bytes", "latency"), space=fixed),
                       tmp_path / "timed.jsonl", LocalExecutor(1))
    assert all(t["state"] == "failed" and "tensorrt" in t["error"].lower() for t in timed["trials"])


# -- parsers and bad input --------------------------------------------------------------------------------


def test_parse_budget():
    assert parse_budget("nll=+0.05,ece=+0.01") == {"nll": 0.05, "ece": 0.01}
    assert parse_budget("accuracy=-0.01") == {"accuracy": -0.01}
    assert parse_budget(None) == {}
    for bad, message in (("nll", "METRIC=CHANGE"), ("speed=+1", "unknown metric"), ("nll=abc", "not a finite"),
                         ("nll=nan", "not a finite"), ("auroc=-0.1", "needs --ood-data")):
        with pytest.raises(InvalidOptionError, match=message):
            parse_budget(bad)


def test_parse_objectives():
    assert [o.name for o in parse_objectives("bytes,latency,nll")] == ["bytes", "latency", "nll"]
    for bad, message in (("bytes,speed", "unknown objective 'speed'"), ("", "comma-separated"),
                         ("nll,nll", "named twice"), ("bytes,auroc", "needs --ood-data")):
        with pytest.raises(InvalidOptionError, match=message):
            parse_objectives(bad)


def test_space_offers_only_modes_the_encodings_export_in():
    assert modes_for("codebook") == ("baked", "shared", "analytic")
    assert modes_for("binary") == ("baked", "analytic")
    assert modes_for("prune+fixed") == ("baked", "noise", "analytic")
    with pytest.raises(InvalidOptionError, match="exports in none of the modes"):
        SearchSpace(schemes=("binary",), modes=("noise",))
    with pytest.raises(InvalidOptionError, match="bits 'x'"):
        SearchSpace(bits=("x",))
    with pytest.raises(InvalidOptionError, match="sigma bits 9"):
        SearchSpace(sigma_bits=(9,))


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"data": "missing.npz"}, InvalidOptionError, "missing.npz"),
    ({"objectives": ("bytes", "speed")}, InvalidOptionError, "unknown objective"),
    ({"device": "tpu"}, InvalidOptionError, "unknown device 'tpu'"),
    ({"model": "nope.ebnn"}, InvalidArtifactError, "nope.ebnn"),
    ({"trials": 0}, InvalidOptionError, "--trials 0"),
])
def test_bad_input_is_refused_before_the_study_file_is_written(files, tmp_path, change, error, message):
    study = tmp_path / "study.jsonl"
    with pytest.raises(error, match=message):
        run_search(settings(files, **change), study, LocalExecutor(1))
    assert not study.exists()


def test_a_study_of_another_search_is_refused_and_left_as_it_was(files, reference, tmp_path):
    study = tmp_path / "study.jsonl"
    run_search(settings(files, trials=1), study, LocalExecutor(1))
    before = study.read_bytes()
    with pytest.raises(InvalidOptionError, match="differs in seed"):
        run_search(settings(files, trials=1, seed=8), study, LocalExecutor(1))
    assert study.read_bytes() == before
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not a journal\n")
    with pytest.raises(InvalidArtifactError, match=r"garbage\.jsonl"):
        run_search(settings(files, trials=1), garbage, LocalExecutor(1))


def test_unreachable_ray_address_is_one_line(files, tmp_path):
    pytest.importorskip("ray")
    r = CliRunner().invoke(main, ["search", str(files[1]), "--data", str(files[0] / "val.npz"), "--executor", "ray",
                                  "--ray-address", "127.0.0.1:1", "--study", str(tmp_path / "s.jsonl")])
    assert r.exit_code == 2
    assert "--ray-address 127.0.0.1:1: no Ray cluster reachable within 5 s" in r.output
    assert not (tmp_path / "s.jsonl").exists()


# -- the command ------------------------------------------------------------------------------------------


def test_cli_writes_report_plot_and_best_artifact(files, tmp_path):
    from edgebnn.api import evaluate_artifact

    root, model = files
    out, png, best = tmp_path / "out.json", tmp_path / "front.png", tmp_path / "best.onnx"
    args = ["search", str(model), "--data", str(root / "val.npz"), "--trials", "4", "--population", "2",
            "--schemes", "fixed,mcq", "--samples", "2,4", "--seed", "3", "--runs", "2", "--warmup", "0",
            "--budget", "nll=+10", "--json", str(out), "--plot", str(png), "--export-best", str(best)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    body = json.loads(out.read_text())
    assert body["schema"] == "edgebnn.search/2" and body["edgebnn_version"]
    assert (tmp_path / "out.study.jsonl").exists()  # the default study file sits beside --json
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    chosen = body["best"]
    # With a budget the trials are measured on half the rows (at random, seed 3) and the best is certified on the
    # other half: the smallest candidate certified (trials and lower --budget's chain, largest first, by the
    # fallback procedure: when every one is certified the last is tested at the full 10%).
    cert = body["certification"]
    assert cert["confidence"] == 0.9 and cert["selection_rows"] + cert["certification_rows"] == 48
    assert cert["selection_rows"] == 24 and all(t["kept"] for t in cert["tested"])
    assert cert["procedure"] == "fallback" and cert["chain_candidates"] >= 1
    assert cert["tested"][-1]["level"] == pytest.approx(0.1)
    assert [t["bytes"] for t in cert["tested"]] == sorted((t["bytes"] for t in cert["tested"]), reverse=True)
    assert "candidates tested, largest first" in r.output and "bound (90%)" in r.output
    # Here the smallest certified is the chain's last candidate (its default noise export stores the IR's codes,
    # smaller than a trial's S = 2 or 4 baked members); the exported best is that lowering, written as edgebnn
    # export writes it: the bytes certified
    last = cert["tested"][-1]
    assert chosen["source"] == last["source"] == "chain" and chosen["label"] == last["label"]
    assert best.stat().st_size == chosen["bytes"] and f"lower --budget's chain ({chosen['label']}" in r.output
    # A trial's exported best is the trial's own graph: same selection rows, same metrics (same graph, same seed).
    trial = min((t for t in body["trials"] if t["state"] == "complete"), key=lambda t: t["bytes"])
    report = {**body, "best": trial}
    export_best(report, tmp_path / "trial.onnx")
    _, rows, _ = open_inputs(str(model), str(root / "val.npz"), None, (0.5, 3, 4000))
    ev = evaluate_artifact(tmp_path / "trial.onnx", data=rows, seed=3)
    for k in ("accuracy", "nll", "ece", "brier"):
        assert ev[k] == pytest.approx(trial["metrics"][k], rel=1e-6, abs=1e-9)
    # A budget nothing keeps (nll=+0.0: binary trials lose NLL, and every chain candidate some): exit 2 saying what
    # was tested; the report is still written, nothing is exported.
    best.unlink()
    r = CliRunner().invoke(main, ["search", str(model), "--data", str(root / "val.npz"), "--trials", "2",
                                  "--population", "2", "--schemes", "binary", "--bits", "1", "--runs", "0",
                                  "--budget", "nll=+0.0", "--json", str(tmp_path / "tight.json"),
                                  "--export-best", str(best)])
    assert r.exit_code == 2, r.output
    assert "no candidate is certified" in r.output and "nothing exported" in r.output
    body = json.loads((tmp_path / "tight.json").read_text())
    assert body["best"] is None and body["closest"] in body["certification"]["tested"]
    assert not best.exists()


@pytest.mark.slow
def test_ray_executor_gives_the_same_trials_as_local(files, reference, tmp_path):
    """A local Ray instance (2 CPUs, loopback, no dashboard): same configs and metrics as the local executor."""
    pytest.importorskip("ray")
    from edgebnn.search import RayExecutor

    report = run_search(settings(files), tmp_path / "study.jsonl", RayExecutor(None, workers=2))
    assert strip_timing(report) == strip_timing(reference)
    assert report["settings"]["executor"] == "ray (local instance, 2 CPUs)"


def test_ray_profiles_ask_for_the_canonical_device_resource():
    """A Jetson node is started with --resources '{"jetson-orin-nano": 1}': an alias must ask for that name."""
    pytest.importorskip("ray")
    from edgebnn.search import RayExecutor

    assert RayExecutor(None, device="jetson").device == "jetson-orin-nano"
    assert RayExecutor(None, device="RTX").device == "rtx"
    with pytest.raises(InvalidOptionError, match="unknown device 'tpu'"):
        RayExecutor(None, device="tpu")


def test_a_device_resource_no_cluster_node_offers_is_one_line():
    """Profile tasks asking for a resource no node has would wait forever: refused before any trial."""
    from edgebnn.search.executors import check_device_resource

    check_device_resource({"CPU": 4.0, "rtx": 1.0}, "rtx", "head:6379")
    check_device_resource({"CPU": 4.0}, "cpu", "head:6379")
    with pytest.raises(InvalidOptionError, match=r"^--ray-address head:6379: no node offers the resource "
                                                 r"'jetson-orin-nano' .*ray start --address head:6379 --resources "
                                                 r"'\{\"jetson-orin-nano\": 1\}'$"):
        check_device_resource({"CPU": 4.0, "rtx": 1.0}, "jetson-orin-nano", "head:6379")


def test_a_local_ray_instance_holds_the_device_resource(files, tmp_path):
    """Without --ray-address this machine is the device: its profile tasks run here (rtx: no TensorRT, so each
    trial records the profile error) instead of waiting for a node that never comes."""
    from edgebnn.search import RayExecutor

    ray = pytest.importorskip("ray")
    with RayExecutor(None, workers=1, device="rtx") as executor:
        assert ray.cluster_resources().get("rtx") == 1  # (else the search below would wait forever)
        report = run_search(settings(files, trials=2, population=2, device="rtx"), tmp_path / "study.jsonl", executor)
    assert [t["state"] for t in report["trials"]] == ["complete", "complete"]
    assert all(t["latency_ms"] is None and t["profile_error"] for t in report["trials"])



@pytest.mark.parametrize(("device", "form"), [("cpu", "integer"), ("rtx", "qdq")])
def test_a_trial_exports_the_form_export_writes_for_its_device(files, device, form):
    """The latency a trial measures is that of the graph `edgebnn export --device` writes (on onnxruntime CPU not
    the Q/DQ form, which dequantizes every member on every call)."""
    import onnx

    from edgebnn.exporters.metadata import read_metadata
    from edgebnn.search.trial import evaluate_trial

    root, model = files
    job = TrialJob(0, TrialConfig("fixed", "4", 2, 4, "baked", "int8", "off"), str(model), str(root / "val.npz"),
                   None, 0, device, runs=1, warmup=0)
    result, proto = evaluate_trial(job)
    assert result["error"] is None and proto is not None
    assert read_metadata(onnx.load_from_string(proto), "trial").form == form


def test_an_rtx_trial_minimizes_the_engine_it_builds(files):
    """On rtx the device loads the engine TensorRT for RTX builds (here, no GPU): a trial's bytes are its bytes."""
    pytest.importorskip("tensorrt_rtx")
    from edgebnn.search.trial import evaluate_trial

    root, model = files
    job = TrialJob(0, TrialConfig("fixed", "4", 2, 4, "analytic", "ir", "off"), str(model), str(root / "val.npz"),
                   None, 0, "rtx", runs=1, warmup=0)
    result, proto = evaluate_trial(job)
    assert result["error"] is None and proto is not None
    assert result["bytes"] == result["engine_bytes"] > result["deployed"]["file_bytes"]


def test_a_weight_format_the_device_cannot_run_is_refused(files, tmp_path):
    with pytest.raises(InvalidOptionError, match=r"^--weights int4: jetson-orin-nano \(TensorRT 10.3\) takes fp32 or "
                                                 r"int8; search with --weights fp32,int8$"):
        run_search(settings(files, device="jetson", space=SearchSpace(weights=("fp32", "int8", "int4"))),
                   tmp_path / "s.jsonl", LocalExecutor(1))
    assert not (tmp_path / "s.jsonl").exists()


def test_an_anytime_trial_exports_evaluates_and_times_its_rule(files):
    """``--samples auto`` is one more choice of S: the trial exports the anytime ensemble (the rule's defaults),
    records the samples its inputs drew and times it on the search data's inputs (not random numbers); the space
    never pairs it with analytic, which draws no samples."""
    import onnx

    from edgebnn.exporters.metadata import read_metadata
    from edgebnn.search.space import ANYTIME
    from edgebnn.search.trial import evaluate_trial, profile_trial

    root, model = files
    job = TrialJob(0, TrialConfig("fixed", "4", 2, ANYTIME, "baked", "fp32", "off"), str(model),
                   str(root / "val.npz"), str(root / "ood.npz"), 0, "cpu", runs=4, warmup=0)
    result, proto = evaluate_trial(job)
    assert result["error"] is None and proto is not None
    assert read_metadata(onnx.load_from_string(proto), "trial").anytime is not None
    assert 4 <= result["metrics"]["samples_used"] <= 16
    timed = profile_trial(result, proto, job)
    assert timed["profile_error"] is None and timed["latency_ms"] > 0
    space = SearchSpace(schemes=("fixed",), bits=("4",), samples=(ANYTIME,), modes=("baked", "analytic"))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    assert {space.suggest(study.ask()).mode for _ in range(8)} == {"baked"}
    assert TrialConfig.from_dict(job.config.to_dict()) == job.config


def test_a_budget_the_rows_cannot_resolve_is_refused_before_any_trial(files, tmp_path):
    """As lower --budget does: the float BNN's own weights against themselves are not certified (an improvement is
    asked for, or more precision than the certification rows give), so no trial runs and no study is written."""
    from edgebnn.budget import BudgetNotMetError

    study = tmp_path / "s.jsonl"
    with pytest.raises(BudgetNotMetError, match=r"nll=-0\.01 is finer than 24 rows resolve .*no number of rows "
                                                r"would.*; no trial was run$"):
        run_search(settings(files, budget="nll=-0.01"), study, LocalExecutor(1))
    assert not study.exists()
    with pytest.raises(BudgetNotMetError, match=r"ece=\+1e-05 is finer than 24 rows resolve .*about \d+ validation "
                                                r"rows would"):
        run_search(settings(files, budget="ece=+0.00001"), study, LocalExecutor(1))
    assert not study.exists()
