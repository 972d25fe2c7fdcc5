"""What the builder tells a member: a summary of the errors at the top, a preview of what they
changed that never shows a default in place of what they typed, the algorithm first, and a
notice (not errors) for a preset written for another machine."""

from __future__ import annotations

import pytest
import yaml
from django.urls import reverse

from tests.webapp.fixtures import builder_data, tiny_config

pytestmark = pytest.mark.django_db


def test_the_preview_shows_an_unreadable_value_as_typed_with_why(client_in, owner):
    data = builder_data(tiny_config(), owner, data__train_batch_size="16x")
    body = client_in.post(reverse("experiments:preview"), data).json()
    whole = yaml.safe_load(body["yaml"])
    assert whole["data"]["train_batch_size"].startswith("16x ← invalid, not used:")
    assert "train_batch_size: 1024" not in body["yaml"]
    assert "16x ← invalid" in body["changes"]


def test_the_preview_lists_what_differs_from_the_preset(client_in, owner):
    data = builder_data(tiny_config(), owner, actor_rollout_ref__rollout__n="6")
    body = client_in.post(reverse("experiments:preview"), data).json()
    assert body["changes"].startswith("# what differs from preset grpo_tiny\n")
    assert yaml.safe_load(body["changes"]) == {"actor_rollout_ref": {"rollout": {"n": 6}}}
    assert "adv_estimator: grpo" in body["yaml"]  # the whole config, for the toggle
    same = client_in.post(reverse("experiments:preview"), builder_data(tiny_config(), owner))
    assert "the same as preset grpo_tiny" in same.json()["changes"]


def test_a_refused_submit_lists_each_error_at_the_top_with_a_link_to_its_field(client_in, owner):
    data = builder_data(
        tiny_config(), owner, data__train_batch_size="16x", actor_rollout_ref__rollout__n="1"
    )
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    html = response.content.decode()
    summary = html[html.index('id="error-summary"') : html.index('id="builder-form"')]
    assert "2 problems to fix" in summary
    assert '<a href="#id_data__train_batch_size">data.train_batch_size</a>:' in summary
    assert '<a href="#id_actor_rollout_ref__rollout__n">actor_rollout_ref.rollout.n</a>:' in (
        summary
    )
    assert summary.index("train_batch_size") < summary.index("rollout.n")  # the page's order


def test_the_algorithm_comes_before_the_actor_and_critic_sections(client_in):
    html = client_in.get(reverse("experiments:new") + "?preset=ppo_tiny").content.decode()
    algorithm = html.index("<legend>Algorithm</legend>")
    assert algorithm < html.index("<legend>Actor (policy training)</legend>")
    assert algorithm < html.index("<legend>Critic (value model)</legend>")


def test_a_gpu_preset_opens_with_a_notice_naming_the_folders_to_point_at(client_in, settings):
    settings.POSTTRAIN_MODEL_ROOTS = "/srv/models"
    response = client_in.get(reverse("experiments:new") + "?preset=grpo_gsm8k")
    html = response.content.decode()
    assert response.status_code == 200
    notice = html[html.index('id="missing-files"') : html.index('id="builder-form"')]
    assert '<a href="#id_actor_rollout_ref__model__path">' in notice
    assert "~/models/Qwen2.5-0.5B-Instruct" in notice
    assert "a Hugging Face model folder under /srv/models (POSTTRAIN_MODEL_ROOTS)" in notice
    assert "<code>data.train_files</code></a> = <code>~/data/gsm8k/train.parquet</code>" in notice
    assert 'data-quiet-fields="' in html and "actor_rollout_ref__model__path" in html
    assert 'id="error-summary"' not in html and "has-error" not in html
