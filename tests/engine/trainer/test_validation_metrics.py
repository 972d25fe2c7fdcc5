"""Validation metrics as verl computes them: hand values on n=2 and n=4, and verl's own functions
(ported verbatim below as a reference implementation) on random validation sets."""

from collections import defaultdict
from functools import partial

import numpy as np
import pytest

from engine.trainer.metrics import (
    bootstrap_indices,
    compute_validation_metrics,
    majority_value,
    process_validation_metrics,
    validation_metric_names,
)


def test_mean_and_std_at_n_and_constant_prompts_by_hand():
    # p1: rewards 1, 0 (mean 0.5, population std 0.5); p2: 3, 3 (every draw's best is 3).
    result = process_validation_metrics(
        ["s"] * 4, ["p1", "p1", "p2", "p2"], {"reward": [1.0, 0.0, 3.0, 3.0]}
    )
    metrics = result["s"]["reward"]
    assert metrics["mean@2"] == pytest.approx((0.5 + 3.0) / 2)
    assert metrics["std@2"] == pytest.approx((0.5 + 0.0) / 2)
    # p1's best of two draws is 1 unless both draw response 1: P = 3/4, over 1000 draws.
    draws = bootstrap_indices(2, 2, 1000, 42)
    p1_best = float(np.mean((draws == 0).any(axis=1)))
    p1_worst = float(np.mean((draws == 0).all(axis=1)))
    assert p1_best == pytest.approx(0.75, abs=0.04)
    assert metrics["best@2/mean"] == pytest.approx((p1_best + 3.0) / 2)
    assert metrics["worst@2/mean"] == pytest.approx((p1_worst + 3.0) / 2)
    p1_best_std = np.sqrt(p1_best * (1 - p1_best))  # std of a 0/1 variable
    assert metrics["best@2/std"] == pytest.approx((p1_best_std + 0.0) / 2)
    assert set(metrics) == {
        "mean@2",
        "std@2",
        "best@2/mean",
        "best@2/std",
        "worst@2/mean",
        "worst@2/std",
    }


def test_one_response_per_prompt_gives_only_mean_at_one():
    metrics = compute_validation_metrics(["s", "s"], ["p", "q"], [1.0, 0.0])
    assert metrics == {"val-core/s/reward/mean@1": 0.5}


def test_subset_sizes_double_from_two_and_end_at_n():
    for n, sizes in ((2, [2]), (5, [2, 4, 5]), (8, [2, 4, 8])):
        metrics = process_validation_metrics(["s"] * n, ["p"] * n, {"reward": list(range(n))})
        found = sorted(
            int(k.split("@")[1].split("/")[0]) for k in metrics["s"]["reward"] if "best" in k
        )
        assert sorted(set(found)) == sizes


def test_majority_vote_takes_the_first_answer_of_the_most_common_prediction():
    assert majority_value(["A", "B", "A"], [0.9, 0.8, 0.7]) == 0.9
    assert majority_value(["B", "A", "A", "B"], [0.1, 0.2, 0.3, 0.4]) == 0.1  # tie: B came first
    # Every draw of a prompt whose predictions all agree votes for its first answer's value.
    metrics = compute_validation_metrics(["s"] * 2, ["p"] * 2, [1.0, 1.0], preds=["7", "7"])
    assert metrics["val-core/s/reward/maj@2/mean"] == 1.0
    assert metrics["val-core/s/reward/maj@2/std"] == 0.0


def test_core_and_aux_sections_follow_verl():
    sources = ["math"] * 4
    infos = {
        "reward": [1.0, 0.0, 1.0, 1.0],
        "acc": [True, False, True, True],
        "pred": ["4", "5", "4", "4"],
        "format": [1.0, 1.0, 0.0, 1.0],
    }
    metrics = compute_validation_metrics(sources, ["p"] * 4, infos["reward"], extra_infos=infos)
    core = sorted(k for k in metrics if k.startswith("val-core/"))
    # acc is the core variable; its mean, best and maj at the largest n are core.
    assert core == [
        "val-core/math/acc/best@4/mean",
        "val-core/math/acc/best@4/std",
        "val-core/math/acc/maj@4/mean",
        "val-core/math/acc/maj@4/std",
        "val-core/math/acc/mean@4",
    ]
    assert metrics["val-core/math/acc/mean@4"] == 0.75
    for name in ("acc/std@4", "acc/best@2/mean", "acc/worst@4/mean", "reward/mean@4"):
        assert f"val-aux/math/{name}" in metrics
    assert metrics["val-aux/math/format/mean@4"] == 0.75
    assert not any("/pred/" in k for k in metrics)  # string predictions are votes, not values
    without_acc = compute_validation_metrics(sources, ["p"] * 4, infos["reward"])
    assert "val-core/math/reward/mean@4" in without_acc


def test_non_numeric_values_are_skipped_for_their_prompt():
    infos = {"reward": [1.0, 0.0, 1.0, 1.0], "note": [None, "x", 2.0, 4.0]}
    result = process_validation_metrics(["s"] * 4, ["p", "p", "q", "q"], infos)
    assert result["s"]["note"]["mean@2"] == 3.0  # only q's values are numbers


def test_numpys_global_generator_is_left_alone():
    np.random.seed(5)
    expected = np.random.rand()
    np.random.seed(5)
    compute_validation_metrics(["s"] * 4, ["p"] * 4, [0.0, 1.0, 2.0, 3.0])
    assert np.random.rand() == expected


def test_every_validation_metric_is_drawn_in_the_validation_panel():
    from webapp.runs.metrics import metric_panel

    infos = {"acc": [1.0, 0.0], "pred": ["1", "2"], "format": [0.5, 1.0]}
    metrics = compute_validation_metrics(["gsm8k"] * 2, ["p"] * 2, [1.0, 0.0], extra_infos=infos)
    metrics["val-aux/num_turns/mean"] = 2.0
    assert {metric_panel(name)["key"] for name in metrics} == {"validation"}


# ---------------------------------------------------------------------------------------------
# Reference implementation for parity: verl/trainer/ppo/metric_utils.py (bootstrap_metric,
# calc_maj_val, process_validation_metrics) and RayPPOTrainer._val_metrics_update, ported
# verbatim apart from docstrings and comments.
def verl_bootstrap_metric(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
    np.random.seed(seed)
    data_np = np.array(data, dtype=object)
    n_data = len(data_np)
    bootstrap_idxs = np.random.choice(n_data, size=(n_bootstrap, subset_size), replace=True)
    n_fns = len(reduce_fns)
    metric_results = np.empty((n_fns, n_bootstrap), dtype=np.float64)
    for fn_idx, reduce_fn in enumerate(reduce_fns):
        for boot_idx in range(n_bootstrap):
            sample = data_np[bootstrap_idxs[boot_idx]]
            metric_results[fn_idx, boot_idx] = reduce_fn(sample)
    result = [
        (float(np.mean(metric_results[fn_idx])), float(np.std(metric_results[fn_idx])))
        for fn_idx in range(n_fns)
    ]
    return result


def verl_calc_maj_val(data, vote_key, val_key):
    vote2vals = defaultdict(list)
    for d in data:
        vote2vals[d[vote_key]].append(d[val_key])
    vote2cnt = {k: len(v) for k, v in vote2vals.items()}
    maj_vote = max(vote2cnt, key=vote2cnt.get)
    maj_val = vote2vals[maj_vote][0]
    return maj_val


def verl_process_validation_metrics(data_sources, sample_uids, infos_dict, seed=42):
    data_src2uid2var2vals = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for sample_idx, data_source in enumerate(data_sources):
        uid = sample_uids[sample_idx]
        var2vals = data_src2uid2var2vals[data_source][uid]
        for var_name, var_vals in infos_dict.items():
            var2vals[var_name].append(var_vals[sample_idx])
    np_mean = np.mean
    np_std = np.std
    reduce_fns_best_worst = [np.max, np.min]
    n_bootstrap = 1000

    def gen_ns(n_resps):
        if n_resps <= 1:
            return []
        ns = []
        n = 2
        while n < n_resps:
            ns.append(n)
            n *= 2
        ns.append(n_resps)
        return ns

    ns_cache = {}
    data_src2uid2var2metric = {}
    for data_source, uid2var2vals in data_src2uid2var2vals.items():
        uid_dict = data_src2uid2var2metric.setdefault(data_source, {})
        for uid, var2vals in uid2var2vals.items():
            pred_vals = var2vals.get("pred")
            has_pred = pred_vals is not None
            var_dict = uid_dict.setdefault(uid, {})
            for var_name, var_vals in var2vals.items():
                if not var_vals or isinstance(var_vals[0], str):
                    continue
                n_resps = len(var_vals)
                metric = {f"mean@{n_resps}": float(np_mean(var_vals))}
                if n_resps > 1:
                    metric[f"std@{n_resps}"] = float(np_std(var_vals))
                    if n_resps not in ns_cache:
                        ns_cache[n_resps] = gen_ns(n_resps)
                    ns = ns_cache[n_resps]
                    for n in ns:
                        (bon_mean, bon_std), (won_mean, won_std) = verl_bootstrap_metric(
                            data=var_vals,
                            subset_size=n,
                            reduce_fns=reduce_fns_best_worst,
                            n_bootstrap=n_bootstrap,
                            seed=seed,
                        )
                        metric[f"best@{n}/mean"] = bon_mean
                        metric[f"best@{n}/std"] = bon_std
                        metric[f"worst@{n}/mean"] = won_mean
                        metric[f"worst@{n}/std"] = won_std
                        if has_pred:
                            vote_data = [
                                {"val": val, "pred": pred}
                                for val, pred in zip(var_vals, pred_vals, strict=True)
                            ]
                            [(maj_n_mean, maj_n_std)] = verl_bootstrap_metric(
                                data=vote_data,
                                subset_size=n,
                                reduce_fns=[
                                    partial(verl_calc_maj_val, vote_key="pred", val_key="val")
                                ],
                                n_bootstrap=n_bootstrap,
                                seed=seed,
                            )
                            metric[f"maj@{n}/mean"] = maj_n_mean
                            metric[f"maj@{n}/std"] = maj_n_std
                var_dict[var_name] = metric
    data_src2var2metric2uid_vals = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for data_source, uid2var2metric in data_src2uid2var2metric.items():
        for uid, var2metric in uid2var2metric.items():  # noqa: B007
            for var_name, metric in var2metric.items():
                for metric_name, metric_val in metric.items():
                    data_src2var2metric2uid_vals[data_source][var_name][metric_name].append(
                        metric_val
                    )
    data_src2var2metric2val = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for data_source, var2metric2uid_vals in data_src2var2metric2uid_vals.items():
        for var_name, metric2uid_vals in var2metric2uid_vals.items():
            for metric_name, uid_vals in metric2uid_vals.items():
                data_src2var2metric2val[data_source][var_name][metric_name] = np.mean(uid_vals)
    return data_src2var2metric2val


def verl_val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict):
    data_src2var2metric2val = verl_process_validation_metrics(
        data_sources, sample_uids, reward_extra_infos_dict
    )
    metric_dict = {}
    for data_source, var2metric2val in data_src2var2metric2val.items():
        core_var = "acc" if "acc" in var2metric2val else "reward"
        for var_name, metric2val in var2metric2val.items():
            n_max = max([int(name.split("@")[-1].split("/")[0]) for name in metric2val.keys()])  # noqa: SIM118
            for metric_name, metric_val in metric2val.items():
                if (
                    (var_name == core_var)
                    and any(metric_name.startswith(pfx) for pfx in ["mean", "maj", "best"])
                    and (f"@{n_max}" in metric_name)
                ):
                    metric_sec = "val-core"
                else:
                    metric_sec = "val-aux"
                pfx = f"{metric_sec}/{data_source}/{var_name}/{metric_name}"
                metric_dict[pfx] = metric_val
    return metric_dict


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_verls_functions_on_random_validation_sets(seed):
    rng = np.random.default_rng(seed)
    sources, uids, infos = [], [], {"reward": [], "acc": [], "pred": [], "format": []}
    # Three data sources with n = 1, 3 and 6 responses per prompt, several prompts each.
    for source, n in (("gsm8k", 6), ("math", 3), ("tiny", 1)):
        for prompt in range(4):
            for _ in range(n):
                pred = str(rng.integers(0, 3))
                sources.append(source)
                uids.append(f"{source}-{prompt}")
                infos["pred"].append(pred)
                infos["acc"].append(float(pred == "0"))
                infos["reward"].append(float(rng.normal()))
                infos["format"].append(float(rng.integers(0, 2)))
    expected = verl_val_metrics_update(sources, uids, infos)
    scores = infos["reward"]
    extra = {k: v for k, v in infos.items() if k != "reward"}
    ours = compute_validation_metrics(sources, uids, scores, extra_infos=extra)
    assert sorted(ours) == sorted(expected)
    for name, value in expected.items():
        assert ours[name] == pytest.approx(float(value), abs=1e-12), name
    direct = validation_metric_names(process_validation_metrics(sources, uids, infos))
    assert direct == ours


def test_the_trainer_reports_verls_validation_metrics(tmp_path):
    from engine.config import load_config
    from engine.tiny import ensure_tiny_assets
    from engine.trainer import PPOTrainer

    ensure_tiny_assets()
    reward_file = tmp_path / "graded.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    pred = solution_str.strip()\n"
        "    acc = pred == str(ground_truth).strip()\n"
        "    return {'score': float(acc) + 0.5, 'acc': acc, 'pred': pred, 'note': None}\n"
    )
    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"custom_reward_function.path={reward_file}",
            "actor_rollout_ref.rollout.val_kwargs.n=4",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
            "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        ],
    )
    trainer = PPOTrainer(config)
    metrics, records = trainer.validate()
    source = "tiny_arithmetic"
    assert sorted(k for k in metrics if k.startswith("val-core/")) == [
        f"val-core/{source}/acc/{name}"
        for name in ("best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std", "mean@4")
    ]
    accuracy = np.mean([r.reward >= 1.0 for r in records])
    assert metrics[f"val-core/{source}/acc/mean@4"] == pytest.approx(accuracy)
    assert metrics[f"val-aux/{source}/reward/mean@4"] == pytest.approx(accuracy + 0.5)
    assert f"val-aux/{source}/acc/worst@2/mean" in metrics
    assert not any("/score/" in k or "/note/" in k or "/pred/" in k for k in metrics)
