"""Training and evaluation of the demo model, on a tiny config so it runs in seconds."""

import json
import math

import numpy as np
import pytest
import torch
from safetensors import safe_open

from sakura_core import cli
from sakura_core.demo.edit_task import ImageBank
from sakura_core.metrics import psnr_uint8 as psnr_db
from sakura_core.models.edit_model import ModelSpec, load_demo_model
from sakura_tools.train.evaluate import evaluate, gini, template_importance
from sakura_tools.train.train import DemoTrainer, TrainConfig

TINY = {
    "patch_size": 1,
    "in_channels": 96,
    "out_channels": 48,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "timestep_guidance_channels": 32,
    "mlp_ratio": 2.0,
    "axes_dims_rope": [4, 4, 4, 4],
    "rope_theta": 2000,
    "guidance_embeds": False,
}
SPEC = ModelSpec(image_size=32, patch_size=4, text_tokens=4, transformer=TINY)


@pytest.fixture(scope="module")
def bank():
    return ImageBank.load(max_side=96)


def _trainer(bank, **kw):
    cfg = {"batch_size": 2, "lr": 3e-3, "warmup_steps": 2, "total_steps": 8, "log_every": 2, "save_every": 4, **kw}
    return DemoTrainer(TrainConfig(**cfg), SPEC, bank)


def test_forward_grad_is_forward_with_autograd(bank):
    tr = _trainer(bank)
    b = tr.batch(0)
    t, noise = tr.draw(0, b.target)
    adapter = tr.model.adapter
    kw = dict(img_grid=SPEC.grid, ref_tokens=b.template, ref_grid=SPEC.grid, split_layer=adapter.num_layers)
    x = tr.model.request_tokens(noise, b.user)
    txt = tr.model.encode_prompt("x").expand(2, -1, -1)
    with_grad = adapter.forward_grad(x, txt, t, **kw).sample
    without = adapter.forward(x, txt, t, **kw).sample
    assert with_grad.requires_grad and not without.requires_grad
    torch.testing.assert_close(with_grad.detach(), without, rtol=0, atol=0)
    with_grad.sum().backward()
    assert adapter.model.x_embedder.weight.grad.abs().sum() > 0


def test_a_few_steps_lower_the_loss_on_a_fixed_batch(bank):
    tr = _trainer(bank, total_steps=25)
    fixed = tr.batch(10_000)  # far from the 25 training batches
    t, noise = tr.draw(10_000, fixed.target)
    with torch.no_grad():
        before = float(tr.loss(fixed, t, noise))
    losses = [tr.train_step() for _ in range(25)]
    with torch.no_grad():
        after = float(tr.loss(fixed, t, noise))
    assert all(math.isfinite(v) for v in losses)
    assert after < 0.8 * before, (before, after)


def test_resume_reproduces_the_uninterrupted_run(bank, tmp_path):
    straight = _trainer(bank)
    summary = straight.run(checkpoint_dir=tmp_path / "a", progress=False)
    assert summary["finished"] and summary["steps"] == 8
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "ckpt-0000004.safetensors",
        "ckpt-0000008.safetensors",
    ]

    first = _trainer(bank)
    for _ in range(4):
        first.train_step()
    ckpt = first.save_checkpoint(tmp_path / "half.safetensors")
    resumed = _trainer(bank)
    resumed.load_checkpoint(ckpt)
    assert resumed.step == 4
    resumed.run(checkpoint_dir=tmp_path / "b", progress=False)
    theirs = resumed.transformer.state_dict()
    for name, value in straight.transformer.state_dict().items():
        assert torch.equal(value, theirs[name]), name
    sa, sb = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)


def test_checkpoint_refuses_other_settings(bank, tmp_path):
    tr = _trainer(bank)
    tr.train_step()
    ckpt = tr.save_checkpoint(tmp_path / "c.safetensors")
    with pytest.raises(ValueError, match="lr"):
        _trainer(bank, lr=1e-3).load_checkpoint(ckpt)
    other = ModelSpec(image_size=32, patch_size=4, text_tokens=4, transformer={**TINY, "mlp_ratio": 3.0})
    with pytest.raises(ValueError, match="transformer config"):
        DemoTrainer(tr.config, other, bank).load_checkpoint(ckpt)
    with pytest.raises(FileNotFoundError):
        tr.load_checkpoint(tmp_path / "missing.safetensors")


def test_time_budget_schedule_follows_elapsed_time(bank):
    tr = _trainer(bank, total_steps=None, lr=1e-3, min_lr_frac=0.1, warmup_steps=2)
    tr.budget_s = 100.0
    tr.step = 5  # past warm-up
    tr.history.elapsed_s = 50.0  # half the budget: cosine at its midpoint
    assert tr.lr_now() == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    tr.history.elapsed_s = 100.0
    assert tr.progress() == 1.0 and tr.lr_now() == pytest.approx(1e-4)
    tr.step, tr.history.elapsed_s = 0, 0.0
    assert tr.lr_now() == pytest.approx(0.5e-3)  # first of two warm-up steps


def test_gini_and_psnr_hand_values():
    assert gini([1, 1, 1, 1]) == 0.0
    assert gini([0, 0, 0, 1]) == pytest.approx(0.75)
    assert gini([1, 3]) == pytest.approx(0.25)  # mean abs difference 1 / (2 * mean 2)
    a = np.zeros((4, 4, 3), np.uint8)
    assert psnr_db(a, a) == 100.0
    assert psnr_db(a, a + 1) == pytest.approx(20 * math.log10(255))


def test_importance_is_a_distribution_over_template_tokens(bank):
    model = load_demo_model(SPEC, weights=None)
    img = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    imp, share = template_importance(model, img, img[::-1].copy(), img[:, ::-1].copy(), times=(0.5, 0.9))
    assert imp.shape == (2, 2, SPEC.num_tokens)
    assert (imp >= 0).all() and (imp.sum(axis=-1) < 1).all()
    assert 0 < share < 1


def test_evaluate_reports_finite_metrics(bank):
    model = load_demo_model(SPEC, weights=None)
    res = evaluate(model, bank, pairs=2, steps=2, probes=1, reference_model=model)
    values = [res["psnr_db"], res["ssim"], res["importance_gini"]]
    values += [res["baselines"][k]["psnr_db"] for k in ("template", "user_image", "naive_composite")]
    assert all(math.isfinite(v) for v in values)
    assert res["importance_reference"]["gini"] == pytest.approx(res["importance_gini"])
    json.dumps(res)  # JSON-serialisable as is


def test_cli_train_then_eval(tmp_path, capsys):
    out = tmp_path / "w.safetensors"
    args = ["train", "demo-model", "--steps", "2", "--batch-size", "1", "--out", str(out), "--no-progress"]
    assert cli.main(args + ["--ckpt-dir", str(tmp_path / "ck"), "--warmup-steps", "1"]) == 0
    with safe_open(str(out), framework="pt") as f:
        record = json.loads(f.metadata()["training"])
    assert record["steps"] == 2 and record["train_config"]["batch_size"] == 1
    assert load_demo_model(weights=out).weights_source == "trained:w.safetensors"

    report = tmp_path / "eval.json"
    eval_args = ["eval", "demo-model", "--json", str(report), "--weights", str(out), "--pairs", "1", "--steps", "1"]
    assert cli.main(eval_args + ["--probes", "1", "--no-reference"]) == 0
    res = json.loads(report.read_text())
    assert {"psnr_db", "ssim", "baselines", "importance_gini"} <= set(res)
    assert all(math.isfinite(res["baselines"][k]["psnr_db"]) for k in ("template", "user_image"))
    assert math.isfinite(res["psnr_db"]) and math.isfinite(res["importance_gini"])
    assert "baseline: return the template" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="training seed"):
        cli.main(["eval", "demo-model", "--json", str(report), "--weights", str(out), "--seed", "0"])


def test_per_step_fraction_draws_the_template_time_per_example(bank, tmp_path):
    tr = _trainer(bank, per_step_frac=0.5, batch_size=16)
    t, _ = tr.draw(3, torch.zeros(16, 4, 4))
    ref_t = tr.ref_times(3, t)
    per_step = ref_t == t
    assert torch.equal(ref_t, tr.ref_times(3, t))  # a function of (seed, step)
    assert 0 < int(per_step.sum()) < 16 and bool((ref_t[~per_step] == 0).all())
    assert _trainer(bank).ref_times(3, t) is None  # single mode only: the forward uses the fixed time
    assert math.isfinite(tr.train_step())
    # a fine-tune starts from the given weights
    w = tmp_path / "w.safetensors"
    from sakura_tools.train.train import save_weights

    save_weights(tr, w)
    ft = _trainer(bank, init_weights=str(w), per_step_frac=1.0)
    assert torch.equal(ft.transformer.x_embedder.weight, tr.transformer.x_embedder.weight)
    with pytest.raises(ValueError, match="per_step_frac"):
        TrainConfig(per_step_frac=1.5)
    with pytest.raises(FileNotFoundError, match="init_weights"):
        TrainConfig(init_weights=str(tmp_path / "missing.safetensors"))


def test_cli_eval_reports_both_kv_modes(tmp_path, capsys):
    report = tmp_path / "eval.json"
    args = ["eval", "demo-model", "--json", str(report), "--pairs", "1", "--steps", "2", "--probes", "0"]
    assert cli.main(args + ["--no-reference", "--kv-mode", "both"]) == 0
    res = json.loads(report.read_text())
    assert res["kv_mode"] == "both" and set(res["modes"]) == {"single", "per-step"}
    assert res["per_step_minus_single_db"] == pytest.approx(
        res["modes"]["per-step"]["psnr_db"] - res["modes"]["single"]["psnr_db"]
    )
    assert res["modes"]["single"]["psnr_db"] != res["modes"]["per-step"]["psnr_db"]
    assert "model edit (KV path, per-step)" in capsys.readouterr().out
